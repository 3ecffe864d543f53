"""The checks of what is given to an option, one function per kind of value.

Every public constructor and factory method checks each option it is given with these, before any I/O, so
a wrong value fails at once with :class:`ConfigurationError` (a ``ValueError`` too), and the message names
the option, what it takes and what it got::

    ConsumerFlow.credit_after must be a number from 0 to 1 (a share of the chunk), not 'half' (a str)
    flow must be a ConsumerFlow or None, not {'initial_credit': 5} (a dict): pass ConsumerFlow(initial_credit=5)

Numbers are never bools (``True`` is an ``int`` to Python, never a count to us), and never NaN or infinite:
every bound smartclient keeps (attempts, seconds, bytes) is a finite one.  Numbers of other libraries
(numpy's, ``fractions.Fraction``) are accepted through the :mod:`numbers` ABCs.  Pure: no I/O, no imports of
the wings; the options' own modules say which option is which kind.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

from smartclient._errors import ConfigurationError

__all__ = ["Check", "backoff", "checked", "choice", "flag", "function", "instance", "number", "provider", "refuse",
           "resolver", "text", "texts", "whole"]


def refuse(name: str, wants: str, value: object, *, wrong_type: bool = True, hint: str = "",
           secret: bool = False) -> NoReturn:
    """Raise the one message of a refused option: ``{name} must be {wants}, not {value!r} (a {type})``; a
    ``secret`` (a password) is never shown, only its type."""
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    shown = f"{article} {kind} (not shown)" if secret else repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    if wrong_type and not secret:
        shown += f" ({article} {kind})"
    raise ConfigurationError(f"{name} must be {wants}, not {shown}{': ' + hint if hint else ''}")


def _shown_number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _wants(kind: str, low: float | None, high: float | None, above: float | None = None,
           below: float | None = None) -> str:
    """``"an int from 0 to 3600"``, ``"a positive number"``, ``"a number from 0 to below 1"``..."""
    n, a = _shown_number, f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"
    if high is not None:
        top = n(high)
    elif below is not None:
        top = f"below {n(below)}"
    elif above == 0:
        return f"a positive {kind}"
    elif low == 0:
        return f"a non-negative {kind}"
    elif low == 1 and kind == "int":
        return "a positive int"
    else:
        return f"{a} of at least {n(low)}" if low is not None else f"{a} above {n(above)}" if above is not None else a
    if low is not None:
        return f"{a} from {n(low)} to {top}"
    if above is not None:
        return f"{a} above {n(above)} and {'at most ' if high is not None else ''}{top}"
    return f"{a} of at most {top}" if high is not None else f"{a} {top}"


def _noted(wants: str, note: str, optional: bool) -> str:
    return wants + (f" ({note})" if note else "") + (" or None" if optional else "")


def whole(name: str, value: Any, *, low: int | None = None, high: int | None = None, optional: bool = False,
          note: str = "") -> None:
    """``value`` is an int (not a bool) from ``low`` to ``high`` (either may be open); None too if ``optional``.

    :raises ConfigurationError: otherwise, naming ``name``.
    """
    if value is None and optional:
        return
    wants = _noted(_wants("int", low, high), note, optional)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        refuse(name, wants, value)
    if (low is not None and int(value) < low) or (high is not None and int(value) > high):
        refuse(name, wants, value, wrong_type=False)


def number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
           above: float | None = None, below: float | None = None, optional: bool = False, note: str = "") -> None:
    """``value`` is a finite real number (an int or a float, not a bool): at least ``low`` (or more than
    ``above``) and at most ``high`` (or less than ``below``); None too if ``optional``.

    :raises ConfigurationError: otherwise (NaN and infinities too), naming ``name``.
    """
    if value is None and optional:
        return
    wants = _noted(_wants("number", low, high, above, below), note, optional)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        refuse(name, wants, value)
    given = float(value)
    if not math.isfinite(given) or (low is not None and given < low) or (above is not None and given <= above) or (
            high is not None and given > high) or (below is not None and given >= below):
        refuse(name, wants, value, wrong_type=False)


def backoff(owner: str, initial: tuple[str, Any], factor: tuple[str, Any], maximum: tuple[str, Any],
            jitter: tuple[str, Any]) -> None:
    """The four numbers of an exponential back-off, each given as ``(its field's name, its value)``: delays in
    seconds from ``initial`` up to ``maximum`` (not below it), each ``factor`` times the last, spread by up to the
    fraction ``jitter`` either way.

    :raises ConfigurationError: naming ``owner``'s field that is wrong.
    """
    number(f"{owner}.{initial[0]}", initial[1], low=0, note="seconds")
    number(f"{owner}.{factor[0]}", factor[1], low=1)
    number(f"{owner}.{maximum[0]}", maximum[1], low=0, note="seconds")
    number(f"{owner}.{jitter[0]}", jitter[1], low=0, below=1, note="a fraction of each delay")
    if maximum[1] < initial[1]:
        raise ConfigurationError(f"{owner} needs {initial[0]} ({initial[1]}) <= {maximum[0]} ({maximum[1]})")


def flag(name: str, value: Any) -> None:
    """``value`` is True or False (not ``"false"``, which is true, nor 0 or None).

    :raises ConfigurationError: otherwise, naming ``name``.
    """
    if not isinstance(value, bool):
        refuse(name, "True or False", value)


def text(name: str, value: Any, *, empty: bool = False, optional: bool = False, note: str = "",
         secret: bool = False) -> None:
    """``value`` is a str, non-empty unless ``empty``; None too if ``optional``.  A ``secret`` is not shown.

    :raises ConfigurationError: otherwise, naming ``name``.
    """
    if value is None and optional:
        return
    wants = _noted("a str" if empty else "a non-empty str", note, optional)
    if not isinstance(value, str):
        refuse(name, wants, value, secret=secret)
    if not value and not empty:
        refuse(name, wants, value, wrong_type=False, secret=secret)


def texts(name: str, value: Any, *, empty: bool = False, optional: bool = False, note: str = "") -> None:
    """``value`` is a list (or tuple, set...) of non-empty strs, not a str itself (whose letters would each be
    taken for one); it may be empty if ``empty``; None too if ``optional``.

    :raises ConfigurationError: otherwise, naming ``name``.
    """
    if value is None and optional:
        return
    wants = _noted("a list of non-empty strs" if empty else "a non-empty list of non-empty strs", note, optional)
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Collection):
        refuse(name, wants, value)
    if (not value and not empty) or not all(isinstance(item, str) and item for item in value):
        refuse(name, wants, value, wrong_type=False)


def choice(name: str, value: Any, choices: Collection[Any]) -> None:
    """``value`` is one of ``choices``.

    :raises ConfigurationError: otherwise, naming ``name`` and every choice.
    """
    try:
        known = value in choices
    except TypeError:  # (an unhashable value in a set)
        known = False
    if not known:
        refuse(name, "one of " + ", ".join(repr(c) for c in choices), value,
               wrong_type=not any(type(value) is type(c) for c in choices))


def instance(name: str, value: Any, kind: type | tuple[type, ...], *, optional: bool = True, what: str = "") -> None:
    """``value`` is a ``kind`` (one of them, for a tuple), or None if ``optional``.  A settings object given as
    a dict is refused with the call to write instead: ``pass ConsumerFlow(initial_credit=5)``.

    :raises ConfigurationError: otherwise, naming ``name``.
    """
    if (value is None and optional) or isinstance(value, kind):
        return
    kinds = kind if isinstance(kind, tuple) else (kind,)
    wants = what or " or ".join(("an " if k.__name__[:1] in "AEIOU" else "a ") + k.__name__ for k in kinds)
    hint = ""
    if isinstance(value, Mapping) and all(isinstance(k, str) and k.isidentifier() for k in value):
        arguments = ", ".join(f"{k}={v!r}" for k, v in value.items())
        hint = f"pass {kinds[0].__name__}({arguments})"
    refuse(name, wants + (" or None" if optional else ""), value, hint=hint)


def function(name: str, value: Any, *, optional: bool = True, takes: str = "") -> None:
    """``value`` can be called (a function, a method, an object with ``__call__``), or is None if ``optional``.

    :raises ConfigurationError: otherwise, naming ``name`` and, with ``takes``, what it is called with.
    """
    if (value is None and optional) or callable(value):
        return
    refuse(name, f"a function{f' ({takes})' if takes else ''}{' or None' if optional else ''}", value)


def provider(name: str, value: Any, method: str, kind: str) -> None:
    """``value`` is None or has a callable ``method``, as an OpenTelemetry ``kind`` (``MeterProvider``:
    ``get_meter``) has; checked here, since a wrong one would fail only when the first instrument is made.

    :raises ConfigurationError: otherwise, naming ``name``.
    """
    if value is None or callable(getattr(value, method, None)):
        return
    refuse(name, f"an OpenTelemetry {kind} (with {method}()) or None", value)


@runtime_checkable
class _Resolves(Protocol):
    """The resolver contract's one required method (:class:`resolvers.Resolves`, declared here too: the core is
    below the resolvers)."""

    def resolve(self, address: Any) -> Any: ...


def resolver(name: str, value: Any, *, optional: bool = True) -> None:
    """``value`` is a resolver: an object with a callable ``resolve``, or a callable (None too if ``optional``).

    :raises ConfigurationError: otherwise (an address given where a resolver goes, say), naming ``name``.
    """
    if (value is None and optional) or callable(value) or isinstance(value, _Resolves):
        return
    refuse(name, f"a resolver (an object with resolve(address), or a function of an address)"
                 f"{' or None' if optional else ''}", value)


Check = Callable[[str, Any], None]
"""One option's check: called with the option's name and the value given; raises ConfigurationError."""

T = TypeVar("T")


def checked(table: Mapping[str, Check | None]) -> Callable[[type[T]], type[T]]:
    """A class decorator: each option of ``__init__`` and of every public method, when a call gives it, is checked
    by the ``table`` entry of its name (``"stream"``), or of the method and its name (``"stored_offset.name"``,
    which may be None: not checked there), before the method runs, so before any I/O.  An option the table does
    not name is left to the method."""

    def decorate(cls: type[T]) -> type[T]:
        for method, member in list(vars(cls).items()):
            if not inspect.isfunction(member) or (method.startswith("_") and method != "__init__"):
                continue
            checks = {option: table.get(f"{method}.{option}", table.get(option))
                      for option in inspect.signature(member).parameters}
            if any(checks.values()):
                setattr(cls, method, _checking(member, {k: v for k, v in checks.items() if v is not None}))
        return cls

    return decorate


def _checking(method: Callable[..., Any], checks: dict[str, Check]) -> Callable[..., Any]:
    signature = inspect.signature(method)

    def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return  # a call that does not fit the signature: the method itself says why
        for option, value in given.items():
            if option in checks:
                checks[option](option, value)

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def checked_coroutine(*args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return await method(*args, **kwargs)

        return checked_coroutine

    @functools.wraps(method)
    def checked_method(*args: Any, **kwargs: Any) -> Any:
        check(args, kwargs)
        return method(*args, **kwargs)

    return checked_method
