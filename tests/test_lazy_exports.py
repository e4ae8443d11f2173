"""The packages that export names imported on first use (`colibri`, `colibri.jitter`,
`colibri.profile`, all through `colibri.lazy.lazy_exports`): every exported name resolves to its
home module's object, importing the package loads none of those homes, and a name it does not
export is an AttributeError naming the package."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = {
    "colibri": ("colibri.engine",),
    "colibri.jitter": ("colibri.jitter.analysis", "colibri.jitter.passes",
                       "colibri.jitter.remedies", "colibri.jitter.variants"),
    "colibri.profile": ("colibri.profile.dataset", "colibri.profile.job",
                        "colibri.profile.shard"),
}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_exported_name_is_its_home_module_s_object(package: str) -> None:
    module = importlib.import_module(package)
    homes = [importlib.import_module(h) for h in PACKAGES[package]]
    for name in module.__all__:
        value = getattr(module, name)
        if name == "__version__":   # colibri's own, from the installed metadata
            assert isinstance(value, str) and value
            continue
        owners = [h for h in homes if getattr(h, name, None) is value]
        assert owners or name in vars(module), f"{package}.{name}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_importing_the_package_loads_none_of_its_homes(package: str) -> None:
    code = (f"import sys, {package}\n"
            f"print(sorted(m for m in {PACKAGES[package]!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_an_unknown_name_is_an_attribute_error_naming_the_package(package: str) -> None:
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nonesuch'"):
        module.nonesuch  # noqa: B018
