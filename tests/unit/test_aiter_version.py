"""Where the installed AITER's version comes from, and what it proves."""

from __future__ import annotations

import sys
import types

import pytest

from vllm_rocm_asm_decode.aiter_version import AiterBuild, has_block_id_fix, installed_version


def fake_distribution(tmp_path, version: str):
    """An installed ``amd-aiter`` as pip leaves it: a dist-info directory on sys.path."""
    info = tmp_path / f"amd_aiter-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {version}\n")
    return tmp_path


@pytest.fixture
def version_module(monkeypatch):
    """``aiter._version`` as AITER's setuptools_scm writes it."""

    def install(version: str | None) -> None:
        module = types.ModuleType("aiter._version")
        if version is not None:
            module.__version__ = version
        monkeypatch.setitem(sys.modules, "aiter._version", module)

    return install


def test_distribution_metadata_comes_first(tmp_path, monkeypatch, version_module):
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path, "0.1.16.post5")))
    version_module("0.1.99")
    assert installed_version() == "0.1.16.post5"


def test_version_module_is_the_second_source(version_module):
    version_module("0.1.20")
    assert installed_version() == "0.1.20"


def test_neither_source_means_unknown(version_module):
    version_module(None)
    assert installed_version() is None
    assert AiterBuild(installed_version()).block_id_problem(65537) is not None


@pytest.mark.parametrize(
    ("version", "fixed"),
    [
        ("0.1.16.post5", False),
        ("0.1.17rc0", False),
        ("0.1.17", True),
        ("0.1.17.post1", True),
        ("0.1.22+rocm7.1", True),
        ("0.1.0", False),
        ("v0.1.20-dirty", None),
        (None, None),
    ],
)
def test_block_id_fix_from_the_version(version, fixed):
    assert has_block_id_fix(version) is fixed


def test_trust_overrides_the_version_but_not_the_limit():
    old = AiterBuild("0.1.16.post5")
    assert old.block_id_problem(65536) is None  # ids 0..65535 fit in 16 bits
    assert old.block_id_problem(65537) is not None
    assert AiterBuild("0.1.16.post5", trusted=True).block_id_problem(10**6) is None
