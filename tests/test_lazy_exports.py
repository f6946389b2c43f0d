"""The packages' lazy exports (trio_coord._lazy) behave as eager imports did.

Every name of each package's ``__all__`` resolves and is listed by ``dir()``,
``from package import *`` gives them all, a name a package lacks raises
AttributeError naming the package and the name, and first uses from several
threads at once all succeed (the imports they trigger run one at a time).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

PACKAGES = ["trio_coord", "trio_coord.client", "trio_coord.security", "trio_coord.spark"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_resolves_is_listed_and_star_imports(name: str) -> None:
    package = importlib.import_module(name)
    for export in package.__all__:
        assert getattr(package, export) is not None, export
        assert export in dir(package), export
    star: dict[str, object] = {}
    exec(f"from {name} import *", star)
    assert set(package.__all__) <= set(star)
    assert all(star[export] is getattr(package, export) for export in package.__all__)


@pytest.mark.parametrize("name", PACKAGES)
def test_a_missing_name_raises_attribute_error_naming_package_and_name(name: str) -> None:
    package = importlib.import_module(name)
    with pytest.raises(AttributeError, match=rf"module '{name}' has no attribute 'Consumr'"):
        package.Consumr  # noqa: B018
    assert not hasattr(package, "Consumr")


FIRST_USES_IN_THREADS = textwrap.dedent(
    """
    import sys, threading, time

    NAMES = ["Broker", "open_broker", "GroupEvent", "Consumer", "Admin", "Producer",
             "open_consumer", "LogConfig", "ConsumerRecord", "Sasl", "Acl",
             "client_ssl_context", "TopicPartition"]

    class SlowFinder:  # (widens the window in which two threads' imports overlap)
        def find_spec(self, name, path=None, target=None):
            if name.startswith("trio_coord."):
                time.sleep(0.002)
            return None

    sys.meta_path.insert(0, SlowFinder())
    failures = []
    for round_ in range(6):  # each round in a fresh trio_coord, nothing imported yet
        for module in [m for m in sys.modules if m.split(".")[0] == "trio_coord"]:
            del sys.modules[module]
        import trio_coord

        barrier = threading.Barrier(len(NAMES))

        def first_use(name):
            barrier.wait()
            try:
                getattr(trio_coord, name)
            except BaseException as exc:
                failures.append(f"round {round_}, {name}: {exc!r}")

        threads = [threading.Thread(target=first_use, args=(n,)) for n in NAMES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print("\\n".join(failures) or "ok")
    """
)


def test_first_uses_from_many_threads_at_once_all_succeed() -> None:
    """Thirteen threads each ask for a different name of a fresh ``trio_coord`` at once:
    every one gets it (without the lock in _lazy, Python's import system fails some
    with _DeadlockError or an ImportError of a partly initialised module)."""
    result = subprocess.run(
        [sys.executable, "-c", FIRST_USES_IN_THREADS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok", result.stdout
