"""OmegaConf interpolations in a YAML job config, resolved as the tools that wrote it resolve them:
`${.hidden_size}`, `${model.tensor_model_parallel_size}`, the NeMo Framework Launcher's own
resolvers (`${multiply:4, ${.hidden_size}}`; launcher_scripts/main.py registers multiply,
divide_ceil and divide_floor) and NeMo's (`${sum:${.num_layers},-1}`; nemo/core/config/
hydra_runner.py registers multiply and sum), with the launcher's mount point: a training config
is its `training` section, so `${training.model.x}` is the file's `model.x`.

A value whose interpolation cannot be resolved (a path of the launcher's, `${data_dir}`) stays its
text, and the reader treats it as it treats any text. omegaconf is imported only for a config
that holds an interpolation."""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from perfmodel.errors import SpecError

# NeMo-Framework-Launcher launcher_scripts/main.py (tag 24.07): the resolvers its configs use;
# NVIDIA/NeMo nemo/core/config/hydra_runner.py (v1.23.0 to 8cfedd7) registers multiply (the same)
# and sum, which NeMo's own example configs use (megatron_gpt_config.yaml:
# cpu_offloading_num_layers ${sum:${.num_layers},-1})
# The largest number a resolver may make: far past any size or count a job config holds (a
# chain of ${multiply:${.a},${.a}} squares at each step: 27 steps made a number of 134 million
# digits, and minutes of arithmetic, from a file of 2 kB)
MAX_RESOLVED = 1e18


def _bounded(function: Any) -> Any:
    def resolver(x: Any, y: Any) -> Any:
        for arg in (x, y):  # a number of thousands of digits is refused before it is used
            if isinstance(arg, (int, float)) and not isinstance(arg, bool) \
                    and not abs(arg) <= MAX_RESOLVED:
                raise ValueError(f"{arg!r:.40} is out of range")
        result = function(x, y)
        if isinstance(result, (int, float)) and not abs(result) <= MAX_RESOLVED:
            raise ValueError("the result is out of range")
        return result
    return resolver


LAUNCHER_RESOLVERS = {
    "multiply": _bounded(lambda x, y: x * y),
    "sum": _bounded(lambda x, y: x + y),
    "divide_ceil": _bounded(lambda x, y: int(math.ceil(x / y))),
    "divide_floor": _bounded(lambda x, y: int(math.floor(x / y))),
}


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    return isinstance(value, str) and "${" in value


def resolved(data: dict[str, Any]) -> dict[str, Any]:
    """data with each interpolated value that resolves replaced by its value."""
    if not _has_interpolation(data):
        return data
    import omegaconf
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # omegaconf 2.1-2.3 register these as register_new_resolver, 2.4 as register_resolver (the
    # same call; 2.1-2.3's register_resolver is the older one, of string arguments)
    major_minor = tuple(int(part) for part in re.findall(r"\d+", omegaconf.__version__)[:2])
    register = OmegaConf.register_resolver if major_minor >= (2, 4) \
        else OmegaConf.register_new_resolver
    for name, function in LAUNCHER_RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            register(name, function)
    try:
        root = OmegaConf.create(data if "training" in data else {**data, "training": data})
    except (OmegaConfBaseException, ValueError, TypeError):
        return data  # a structure OmegaConf does not hold: the values as written

    def walk(value: Any, path: list[str | int]) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, [*path, k]) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, [*path, i]) for i, v in enumerate(value)]
        if not (isinstance(value, str) and "${" in value):
            return value
        node: Any = root
        try:
            for key in path[:-1]:
                node = node[key]
            result = node[path[-1]]  # resolved on access
        except (OmegaConfBaseException, ValueError, TypeError, KeyError, IndexError,
                ArithmeticError):
            return value
        if OmegaConf.is_config(result):
            return OmegaConf.to_container(result, resolve=False)
        return result

    with _time_limit(RESOLVE_LIMIT_S):
        out: dict[str, Any] = walk(data, [])
    return out


# How long the interpolations of one config may take to resolve: a config's resolve in
# milliseconds, but OmegaConf resolves a reference anew at every use, so values that repeat one
# another (s1: "${.s0}${.s0}...", s2: "${.s1}${.s1}...") take time that multiplies at each level
# (8 levels of 10: hours, from a file of 1 kB)
RESOLVE_LIMIT_S = 5.0


class _TooSlow(BaseException):  # not Exception: OmegaConf wraps those as its own errors
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise SpecError where the block runs longer than seconds (a timer signal, in the main
    thread; elsewhere, or where the process runs a timer of its own, which this one would
    replace and cancel, the block runs unbounded)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _TooSlow:
        raise SpecError(f"the config's ${{...}} interpolations do not resolve in {seconds:g} s: "
                        "values that repeat one another at each level (an interpolation "
                        "bomb?); a job config's resolve at once") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
