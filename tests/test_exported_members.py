from __future__ import annotations

import inspect
from pathlib import Path

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


def test_every_export_is_documented_in_the_reference() -> None:
    # mkdocstrings renders every name of ``__all__`` from this directive; each needs a docstring.
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "index.md").read_text()
    assert "::: gradfed_ipfs\n" in page
    undocumented = [
        name
        for name in gradfed_ipfs.__all__
        if callable(member := getattr(gradfed_ipfs, name)) and not inspect.getdoc(member)
    ]
    assert not undocumented, f"no docstring: {undocumented}"


def test_the_top_package_exports_no_seed_alias() -> None:
    import gradfed_ipfs.seed as seed

    aliases = {"LegacyBackwardPassCoordinator", "GradientPrivacyBudget", "BackwardPassConfig"}
    assert aliases <= set(seed.__all__)
    assert not aliases & set(gradfed_ipfs.__all__)
    for name in gradfed_ipfs.__all__:
        module = getattr(getattr(gradfed_ipfs, name), "__module__", "") or ""
        assert not module.startswith("gradfed_ipfs.seed"), name
