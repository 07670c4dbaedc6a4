"""The ``CI=true`` rule of tests/required.py, on small pytest sessions run by ``pytester``."""

from __future__ import annotations

import pytest

CONFTEST = """
from tests.required import register

def pytest_configure(config):
    register(config)
"""

TESTS = """
from tests.required import skip_area

def test_runs():
    pass

def test_needs_torch():
    skip_area("torch", "torch is not installed")

def test_needs_the_wan_profile():  # not a required area
    import pytest
    pytest.skip("WAN profile: set GRADFED_WAN=1")
"""


@pytest.fixture
def session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester dir with the plugin installed, under ``CI=true`` and no opt-out."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("GRADFED_ALLOW_SKIP", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return pytester


def test_a_required_area_skip_fails_a_ci_run_naming_the_area_and_reason(
    session: pytest.Pytester,
) -> None:
    session.makepyfile(test_areas=TESTS)
    result = session.runpytest_inprocess("-rs")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "CI=true: required area torch (1 skip, e.g. test_areas.py::test_needs_torch): "
            "torch is not installed -- set it up, or allow it with GRADFED_ALLOW_SKIP=torch"
        ]
    )
    result.stdout.no_fnmatch_line("*required area*WAN*")


def test_the_opt_out_lets_the_named_area_skip_and_says_so(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRADFED_ALLOW_SKIP", "docker, torch")
    session.makepyfile(test_areas=TESTS)
    result = session.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "CI opt-out: docker tests may skip (GRADFED_ALLOW_SKIP)",
            "CI opt-out: torch tests may skip (GRADFED_ALLOW_SKIP)",
            "*",
            "CI opt-out: docker tests may skip (GRADFED_ALLOW_SKIP); none skipped",
            "CI opt-out: torch tests may skip (GRADFED_ALLOW_SKIP); skipped: torch (1 skip, *",
        ]
    )
    result.stdout.no_fnmatch_line("CI=true: required area*")


def test_without_ci_a_required_area_skip_only_shows_in_the_summary(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI")
    session.makepyfile(test_areas=TESTS)
    result = session.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["required areas skipped (CI=true fails on them): torch (1)"])


def test_a_module_skipped_at_import_fails_a_ci_run(session: pytest.Pytester) -> None:
    session.makepyfile(
        test_sklearn="""
        from tests.required import import_area

        import_area("sklearn", "a_module_that_is_not_installed")

        def test_never_collected():
            pass
        """
    )
    result = session.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # not 5, "no tests ran"
    result.stdout.fnmatch_lines(
        [
            "CI=true: required area sklearn (1 skip, e.g. test_sklearn.py): "
            "a_module_that_is_not_installed is not installed (No module named *"
        ]
    )


def test_a_ci_run_with_only_other_skips_passes(session: pytest.Pytester) -> None:
    session.makepyfile(test_wan="import pytest\n\ndef test_wan():\n    pytest.skip('needs root')\n")
    result = session.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=1)


def test_a_typo_in_the_opt_out_is_a_usage_error(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRADFED_ALLOW_SKIP", "dokcer")
    session.makepyfile(test_areas=TESTS)
    result = session.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*GRADFED_ALLOW_SKIP names unknown area(s) dokcer (areas: *"])


def test_an_unknown_area_name_in_a_test_is_a_programming_error() -> None:
    from tests.required import skip_area

    with pytest.raises(ValueError, match="unknown test area 'gpu'"):
        skip_area("gpu", "no GPU")
