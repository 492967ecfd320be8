"""A cell's pins against what a probe manifest found: release builds match, other releases, post
releases and missing packages do not, and a broken probe section is no version at all."""

from __future__ import annotations

import pytest

from gdn.matrix.config import Versions
from gdn.matrix.schema import PinDifference
from gdn.matrix.versions import PIN_PATHS, matches, pin_differences

pytestmark = pytest.mark.tooling

HOST_MANIFEST = {
    "python": {"version": "3.12.3"},
    "torch": {"version": "2.11.0+cu130", "cuda": "13.0"},
    "triton": {"flavour": "triton", "distributions": {"triton": "3.6.0"}, "import": {"ok": True, "version": "3.6.0"}},
    "torch_npu": {"distribution": None},
    "cann": {"present": False, "toolkit": {"present": False}},
    "fla_npu": {"error": "RuntimeError: fla_npu broke the probe"},
    "fla": {"distribution": None},
    "transformers": {"distribution": {"name": "transformers", "version": "5.17.0"}},
}


@pytest.mark.parametrize(
    ("package", "pinned", "found", "same"),
    [
        ("torch", "2.11.0", "2.11.0+cu130", True),
        ("torch", "2.11.0", "2.11.0", True),
        ("torch", "2.13.0", "2.11.0+cu130", False),
        ("torch", "2.11.0", "2.11.0rc1", False),
        ("torch_npu", "2.9.0.post3", "2.9.0.post2", False),
        ("torch_npu", "2.9.0.post3", "2.9.0.post3", True),
        ("python", "3.12", "3.12.3", True),
        ("python", "3.12", "3.13.0", False),
        ("cuda", "13.0", "13.0", True),
        ("cann", "8.5.0", "8.5.0", True),
        ("cann", "not a version", "not a version", True),
        ("cann", "8.5.0", "8.5.RC1-weird!", False),
    ],
)
def test_matches(package, pinned, found, same):
    assert matches(package, pinned, found) is same


def test_every_pin_has_a_place_in_the_manifest():
    assert set(PIN_PATHS) == set(Versions.model_fields)


def test_differences_name_package_pin_and_what_was_found():
    pins = Versions(
        python="3.12",
        cuda="13.0",
        torch="2.13.0",
        triton="3.6.0",
        triton_ascend="3.2.0",
        fla="0.6.0",
        fla_npu="26.10.0",
        transformers="5.17.0",
    )
    assert pin_differences(pins, HOST_MANIFEST) == [
        PinDifference(package="torch", pinned="2.13.0", found="2.11.0+cu130"),
        PinDifference(package="triton_ascend", pinned="3.2.0", found="not installed"),
        PinDifference(
            package="fla_npu",
            pinned="26.10.0",
            found="unknown (the probe's fla_npu section failed: RuntimeError: fla_npu broke the probe)",
        ),
        PinDifference(package="fla", pinned="0.6.0", found="not installed"),
    ]
    assert pin_differences(Versions(), HOST_MANIFEST) == []


def test_peer_kernel_packages_are_compared_with_what_fla_found_beside_it():
    manifest = {
        **HOST_MANIFEST,
        "fla": {
            "distribution": {"name": "fla-core", "version": "0.6.0"},
            "peer_packages": {"flash-qla": "0.1.3", "tilelang": None},
        },
    }
    differences = pin_differences(Versions(fla="0.6.0", flash_qla="0.1.3", tilelang="0.1.15"), manifest)
    assert differences == [PinDifference(package="tilelang", pinned="0.1.15", found="not installed")]
