from __future__ import annotations

import gradfed_ipfs


def test_all_is_sorted_and_complete() -> None:
    names = gradfed_ipfs.__all__
    assert names == sorted(names, key=str.casefold)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(gradfed_ipfs, name), name


def test_exports_point_at_the_top_package() -> None:
    for name in gradfed_ipfs.__all__:
        member = getattr(gradfed_ipfs, name)
        if hasattr(member, "__module__") and callable(member):
            assert member.__module__ == "gradfed_ipfs", name
