# SPDX-License-Identifier: Apache-2.0
"""pytest fixtures for the Python package's tests: the mount, the build, the phases, the closing count.

tests/python/test_python.sh runs the suites as `make check` does: it mounts a store, runs pytest with
--mnt/--store/--plain/--state and --phase first, mounts the same store again (a new daemon) and runs
--phase remount. Run by hand, a test needs no options: without --mnt, the `mount` fixture mounts a
fresh store of --build (default: the repository's build/) in a temporary directory for the session
(root and /dev/fuse needed) and unmounts it after:

    python3 -m pytest tests/python/test_package.py -k digest
    python3 -m pytest tests/python/test_names.py::test_dtypes_the_library_s_table_entry_by_entry_and_in_order

test_direct.py mounts its own store (allow_other, remounts, a damaged object) with --mount-opts;
test_gpu.py is skipped where torch sees no CUDA device.

Phases: a test marked @pytest.mark.phase("remount") checks what an earlier phase left in the store
and runs only with --phase remount (its state file, --state, comes from --phase first); the others
run with --phase first, the default. Tests of the other phase are deselected, not skipped.

What a test measured (seconds, page-cache growth) it reports with the `note` fixture; the notes are
printed after the tests, before the closing count. The run ends with one line, "LABEL: N passed,
N failed, N skipped" (--label, default python), which tests/run-tests adds up: errors in set-up or
collection count as failed, skips as skipped, never as passed.
"""

import os
import shutil
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "lib", "python"))
# Python processes the tests start import the same package.
os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "lib", "python")] +
                                           ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))

import wfstest  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("weightfs")
    g.addoption("--build", default=os.path.join(REPO, "build"), help="build directory (weightfs, libweightfs.so)")
    g.addoption("--mnt", help="a weightfs mount to test (default: mount a fresh store for the session)")
    g.addoption("--store", help="the store mounted on --mnt")
    g.addoption("--plain", help="a plain directory (no weightfs) for the fallbacks")
    g.addoption("--state", help="file the first phase writes and the remount phase reads")
    g.addoption("--phase", default="first", choices=["first", "remount"], help="which phase's tests run")
    g.addoption("--mount-opts", action="append", default=[],
                help="mount options (comma-separated) of the stores the tests mount themselves")
    g.addoption("--label", default="python", help="label of the closing count line")
    g.addoption("--models", default="blazeface,blazeface-back,nanodet,faceres-deep,movenet-thunder",
                help="test_multirank.py: the real-weights models, comma-separated, or 'all'")
    g.addoption("--ranks", type=int, default=4, help="test_multirank.py: trainer ranks")
    g.addoption("--package", help="test_multirank.py: unpacked weights package (default: fetch-weights')")


def pytest_configure(config):
    config.addinivalue_line("markers", "phase(name): the test runs only with --phase NAME (default: first)")


def _phase_of(item):
    m = item.get_closest_marker("phase")
    return m.args[0] if m else "first"


def pytest_collection_modifyitems(config, items):
    want = config.getoption("--phase")
    keep = [i for i in items if _phase_of(i) == want]
    gone = [i for i in items if _phase_of(i) != want]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


def pytest_terminal_summary(terminalreporter):
    st = terminalreporter.stats
    notes = []
    for rep in st.get("passed", []) + st.get("failed", []) + st.get("error", []):
        for key, text in getattr(rep, "user_properties", []):
            if key == "note" and (rep.nodeid, text) not in notes:
                notes.append((rep.nodeid, text))
    if notes:
        terminalreporter.write_sep("-", "notes")
        for nodeid, text in notes:
            terminalreporter.write_line(f"# {nodeid.rsplit('::', 1)[-1]}: {text}")
    passed = len(st.get("passed", []))
    failed = len(st.get("failed", [])) + len(st.get("error", []))
    skipped = len(st.get("skipped", []))
    label = terminalreporter.config.getoption("--label")
    terminalreporter.write_line(f"{label}: {passed} passed, {failed} failed, {skipped} skipped")


@pytest.fixture
def note(request):
    """note(text): what the test measured, printed in the notes before the closing count."""
    return lambda text: request.node.user_properties.append(("note", text))


# ---- the mount ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def build(pytestconfig):
    b = os.path.abspath(pytestconfig.getoption("--build"))
    os.environ.setdefault("WEIGHTFS_LIB", os.path.join(b, "libweightfs.so"))
    return b


@pytest.fixture(scope="session")
def mount_opts(pytestconfig):
    """--mount-opts as a list of options."""
    return [o for arg in pytestconfig.getoption("--mount-opts") for o in arg.split(",") if o]


@pytest.fixture(scope="session")
def mount(pytestconfig, build, mount_opts):
    """(mount point, store): --mnt and --store as given (store None without --store), else a fresh
    store mounted with --mount-opts for the session."""
    mnt = pytestconfig.getoption("--mnt")
    if mnt:
        store = pytestconfig.getoption("--store")
        yield os.path.abspath(mnt), os.path.abspath(store) if store else None
        return
    if not os.access(os.path.join(build, "weightfs"), os.X_OK):
        pytest.fail(f"{build}/weightfs is missing: run make, or pass --mnt")
    work = tempfile.mkdtemp(prefix="wfs-pytest.")
    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    wfstest.mount(build, store, mnt, mount_opts)
    try:
        yield mnt, store
    finally:
        wfstest.umount(mnt)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def mnt(mount):
    return mount[0]


@pytest.fixture(scope="session")
def store(mount):
    if mount[1] is None:
        pytest.fail("--mnt without --store: this test reads the store")
    return mount[1]


@pytest.fixture(scope="session")
def plain(pytestconfig, tmp_path_factory):
    """A plain directory (the fallbacks: no claims there)."""
    p = pytestconfig.getoption("--plain") or str(tmp_path_factory.mktemp("plain"))
    os.makedirs(p, exist_ok=True)
    return p


@pytest.fixture(scope="session")
def state_file(pytestconfig, tmp_path_factory):
    return pytestconfig.getoption("--state") or str(tmp_path_factory.mktemp("state") / "state.json")


@pytest.fixture(scope="session")
def phase(pytestconfig):
    return pytestconfig.getoption("--phase")
