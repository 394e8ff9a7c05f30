# SPDX-License-Identifier: Apache-2.0
"""The Python package's names and tables against the C library's, and the package installed by pip.

    python3 -m pytest tests/python/test_names.py [--build BUILD_DIR]

No mount needed. Checks, each entry by entry: the dtype table read through ctypes and the package's
fallback copy (lib/dtype.c), the shape grammar (wfs_shape_parse and the Python fallback agree on
valid and invalid shapes), the temporary-name prefix (wfs_tmp_prefix(), lib/weightfs.h) and the xattr
names (lib/weightfs.h). Then `pip install --no-index --no-build-isolation --target` of a copy of
lib/python, an import of it, and that an installed package finds libweightfs.so in PREFIX/lib.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import wfstest

import weightfs
import weightfs.names as names
import weightfs.dtypes as wdtypes
import weightfs.offloading as woff
import weightfs.tensor as wt

SHAPES_VALID = ["[]", "[4096,1024]", " [ 3 , 5 ,7 ] ", "[0]", "[\t1,\n2\r]", "[18446744073709551615]",
                "[" + ",".join(["1"] * 32) + "]", "[007]"]
SHAPES_INVALID = ["", "[", "]", "[1,]", "[,1]", "[-1]", "[1.5]", "[1e3]", "[true]", "[18446744073709551616]",
                  "[" + ",".join(["1"] * 33) + "]", "[1] x", "(1,2)", "[\u00a01]", "[\u0661]", "[1 2]"]


def header_defines(path):
    with open(path) as f:
        return dict(re.findall(r'^#define (WFS_\w+) "([^"]*)"', f.read(), re.M))


@pytest.fixture(scope="module")
def lib():
    return names._library()


@pytest.fixture(scope="module")
def h():
    return header_defines(os.path.join(wfstest.REPO, "lib", "weightfs.h"))


def test_library_libweightfs_so_loads_and_exports_the_name_table(lib):
    """library: libweightfs.so loads and exports the name/table functions"""
    assert lib is not None, "names._library() is None"


def test_dtypes_the_library_s_table_entry_by_entry_and_in_order_is(lib):
    """dtypes: the library's table, entry by entry and in order, is the package's fallback"""
    got = names.library_dtype_bytes(lib)
    assert list(got.items()) == list(names.FALLBACK_DTYPE_BYTES.items()), (got, names.FALLBACK_DTYPE_BYTES)
    assert names.dtype_bytes() == got
    assert "F8_E8M0" in got and got["C64"] == 8


def test_dtypes_every_library_dtype_has_a_torch_name_when_this_torch(lib):
    """dtypes: every library dtype has a torch name (when this torch has it) and load() knows it"""
    for name in names.library_dtype_bytes(lib):
        assert name in wdtypes._TORCH_NAMES, name
        assert wdtypes.dtype_name(name) == name


def test_shapes_wfs_shape_parse_and_the_python_fallback_agree_on(lib):
    """shapes: wfs_shape_parse and the Python fallback agree on valid shapes"""
    for text in SHAPES_VALID:
        assert names.library_parse_shape(lib, text) == names.fallback_parse_shape(text), text
    assert names.parse_shape("[4096,1024]") == (4096, 1024)
    assert names.parse_shape("[]") == ()


def test_shapes_wfs_shape_parse_and_the_python_fallback_refuse_the(lib):
    """shapes: wfs_shape_parse and the Python fallback refuse the same invalid shapes"""
    for text in SHAPES_INVALID:
        for parse in (lambda t: names.library_parse_shape(lib, t), names.fallback_parse_shape):
            try:
                parse(text)
            except ValueError:
                continue
            raise AssertionError(f"{parse} accepted {text!r}")


def test_temp_names_the_package_s_prefix_is_wfs_tmp_prefix_and_wfs(lib, h):
    """temp names: the package's prefix is wfs_tmp_prefix() and WFS_TMP_PREFIX; offload uses it"""
    assert lib.wfs_tmp_prefix().decode() == names.TMP_PREFIX == h["WFS_TMP_PREFIX"]
    tmp = os.path.basename(woff._tmp_name("/d/x.bin"))
    assert tmp.startswith(f"{names.TMP_PREFIX}{os.getpid()}-"), tmp


def test_xattr_names_the_package_s_are_lib_weightfs_h_s(h):
    """xattr names: the package's are lib/weightfs.h's"""
    for attr, macro in (("CLAIM_XATTR", "WFS_XATTR_CLAIM"), ("CLAIMS_XATTR", "WFS_XATTR_CLAIMS"),
                        ("DIGEST_XATTR", "WFS_XATTR_DIGEST"),
                        ("DTYPE_XATTR", "WFS_XATTR_DTYPE"), ("SHAPE_XATTR", "WFS_XATTR_SHAPE"),
                        ("STATS_XATTR", "WFS_XATTR_STATS")):
        assert getattr(names, attr) == h[macro], attr
    assert wt.DTYPE_XATTR == h["WFS_XATTR_DTYPE"] and weightfs.tensor.CLAIM_XATTR == h["WFS_XATTR_CLAIM"]


def test_fallback_without_the_library_the_tables_are_the_package_s():
    """fallback: without the library, the tables are the package's own copies"""
    code = ("import weightfs.names as n\n"
            "n._loaded, n._lib = True, None\n"
            "assert n.dtype_bytes() is n.FALLBACK_DTYPE_BYTES\n"
            "assert n.parse_shape(' [2, 3] ') == (2, 3)\n"
            "import weightfs.tensor as t\n"
            "assert t.tensor_info.__module__ == 'weightfs.loading' and t.dtype_name('c64') == 'C64'\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr.strip().splitlines()[-3:]


# ---- the package installed by pip ------------------------------------------------------------------

@pytest.fixture(scope="module")
def pip_target(build):
    """pip install --no-index --no-build-isolation --target of a copy of lib/python: (work directory,
    PREFIX, its site-packages, the environment without PYTHONPATH and WEIGHTFS_LIB, pip's result)."""
    work = tempfile.mkdtemp(prefix="wfs-python-names.")
    try:
        src = os.path.join(work, "src")
        shutil.copytree(os.path.join(wfstest.REPO, "lib", "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        prefix = os.path.join(work, "prefix")
        site = os.path.join(prefix, "lib", "python3", "site-packages")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WEIGHTFS_LIB")}
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                            "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", site,
                            src], capture_output=True, text=True, env=env)
        yield work, prefix, site, env, r
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_pip_pip_install_no_index_no_build_isolation_target(pip_target):
    """pip: pip install --no-index --no-build-isolation --target installs the package"""
    work, prefix, site, env, r = pip_target
    assert r.returncode == 0, (r.stdout + r.stderr).strip().splitlines()[-5:]
    for f in ("__init__.py", "names.py", "tensor.py", "stage.py", "frozen.py", "py.typed", "VERSION",
              "errors.py", "digests.py", "dtypes.py", "claims.py", "offloading.py", "loading.py"):
        assert os.path.isfile(os.path.join(site, "weightfs", f)), f


def test_pip_the_installed_package_imports_from_where_pip_put_it_and(pip_target, build):
    """pip: the installed package imports from where pip put it and finds PREFIX/lib/libweightfs.so"""
    work, prefix, site, env, r = pip_target
    assert r.returncode == 0, "pip install failed (see the test above)"
    os.makedirs(os.path.join(prefix, "lib"), exist_ok=True)
    # The library the suite's Python loads (test_python.sh: not a sanitizer build, which a
    # plain python3 cannot load), as make install would put it.
    lib = os.environ.get("WEIGHTFS_LIB") or os.path.join(build, "libweightfs.so")
    shutil.copy(lib, os.path.join(prefix, "lib", "libweightfs.so"))
    code = ("import weightfs, weightfs.stage as s, weightfs.names as n\n"
            "print(weightfs.__file__); print(s.library()._name); print(weightfs.digest(b'abc'))\n"
            "print(n._library() is not None)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=work,
                       env=dict(env, PYTHONPATH=site))
    assert r.returncode == 0, r.stderr.strip().splitlines()[-3:]
    out = r.stdout.split("\n")
    assert out[0] == os.path.join(site, "weightfs", "__init__.py"), out
    assert out[1] == os.path.join(prefix, "lib", "libweightfs.so"), out
    assert out[2] == "06b05ab6733a618578af5f94892f3950" and out[3] == "True", out


def test_pip_weightfs_lib_picks_the_library_for_an_installed_package(pip_target, build):
    """pip: WEIGHTFS_LIB picks the library for an installed package"""
    work, prefix, site, env, r = pip_target
    assert r.returncode == 0, "pip install failed (see the first pip test)"
    lib_path = os.path.abspath(os.environ.get("WEIGHTFS_LIB") or os.path.join(build, "libweightfs.so"))
    r = subprocess.run([sys.executable, "-c", "import weightfs.stage as s; print(s.library()._name)"],
                       capture_output=True, text=True, cwd=work,
                       env=dict(env, PYTHONPATH=site, WEIGHTFS_LIB=lib_path))
    assert r.returncode == 0 and r.stdout.strip() == lib_path, (r.stdout, r.stderr)
