"""The one way between a program a model wrote and the test that judges it (`eval --run-code`):
plain data, never an object of the program's.

The program runs in a process of its own (`serve`: its code, then the calls asked of it); the
test runs in another, the judge's (`judge`), which the program cannot reach (launcher.py says
how). Each name the test calls that the task's own code does not define (the entry point always)
is a `Remote` there: calling it sends the arguments to the program's process and takes back the
result, each as plain data (`encode`, `decode`), exactly: None, booleans, numbers (a float by its
bits where it is a NaN, so its payload too), strings (as their code points where they hold a lone
surrogate, which JSON would join with its neighbour into one character), bytes, lists, tuples,
dicts, sets; an exception by its type's name; anything else an `Opaque` that equals only itself.
So no value of the program's runs code in the judge (an always-equal value is opaque), the
program's own `check`, globals, frames or early exits decide nothing, and the test passes only
when its last statement returned in the judge's process. Arguments the program mutates come back
(a list sorted in place is sorted in the test's hands too).

Standard library only, and run from its source text as well as imported: the launcher (run by
path) and the program's process (run with -c) cannot import localcos. What the program's process
imports is part of every program's cost: the judge's modules are imported where it needs them.
"""

from __future__ import annotations

import _socket
import builtins
import json
import os
import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

ENDED = "ended"  # the judge's word when the program's process ended (or broke the channel) before the test did
_LENGTH = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")
_MOST_BYTES = 64 << 20  # the largest message either side takes
_DEEPEST = 100  # nesting a value may have
_EXACT_INT = 1 << 53  # ints below this in size cross as JSON numbers, the rest as hexadecimal (no digit limit)


class Opaque:
    """A value of the program's that is not plain data (an object of its own class, a
    generator, a function): known by its type's name, equal only to itself."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"<a {self.kind} of the program's>"


class CannotCross(TypeError):
    """A value that is not plain data, where only plain data may cross."""


# -- plain data ----------------------------------------------------------------------------------

_TAGS: tuple[tuple[Any, str], ...] = ((list, "l"), (tuple, "t"), (set, "s"), (frozenset, "f"))


def encode(value: Any, strict: bool = True, depth: int = 0) -> Any:
    """`value` as a JSON-ready tree, exact types only (a subclass of a plain type crosses as the
    plain type: a namedtuple as a tuple). Anything else raises CannotCross, or with `strict`
    False becomes an opaque marker of its type's name."""
    if depth > _DEEPEST:
        raise CannotCross(f"a value nested more than {_DEEPEST} deep")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        text = str.__str__(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: JSON's escapes would pair it with its neighbour
            return ["u", text.encode("utf-32-be", "surrogatepass").hex()]
        return text
    if isinstance(value, int):
        number = int.__index__(value)
        return number if -_EXACT_INT < number < _EXACT_INT else ["i", format(number, "x")]
    if isinstance(value, float):
        return _float(float.__float__(value))
    if isinstance(value, complex):
        return ["c", _float(value.real), _float(value.imag)]
    if isinstance(value, dict):
        return ["d", *([encode(k, strict, depth + 1), encode(v, strict, depth + 1)] for k, v in dict.items(value))]
    for kind, tag in _TAGS:
        if isinstance(value, kind):
            return [tag, *(encode(v, strict, depth + 1) for v in kind.__iter__(value))]
    if isinstance(value, (bytes, bytearray)):
        return ["y" if isinstance(value, bytearray) else "b", bytes(value).hex()]
    if strict:
        raise CannotCross(f"a {type(value).__name__} cannot cross between the test and the program (only plain data does)")
    return ["o", type(value).__name__]


def _float(number: float) -> Any:
    """A float as JSON carries it exactly (-0.0, infinities and subnormals as its repr), a NaN by
    its bits (JSON has one NaN)."""
    return ["n", _DOUBLE.pack(number).hex()] if number != number else number


def _float_of(node: Any) -> float:
    if type(node) in (int, float):
        return float(node)
    if type(node) is list and len(node) == 2 and node[0] == "n" and type(node[1]) is str and len(node[1]) == 2 * _DOUBLE.size:
        return _DOUBLE.unpack(bytes.fromhex(node[1]))[0]
    raise ValueError("not a number")


def decode(node: Any, depth: int = 0) -> Any:
    """The value a tree from `encode` stands for, built of exact plain types (and `Opaque`) only;
    anything else raises ValueError."""
    if depth > _DEEPEST + 1:
        raise ValueError("nested too deeply")
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError("not a value")
    tag, items = node[0], node[1:]
    if tag in ("i", "b", "y", "o", "u", "n") and not (len(items) == 1 and type(items[0]) is str):
        raise ValueError("not a value")
    if tag == "i":
        return int(items[0], 16)
    if tag == "u":
        return bytes.fromhex(items[0]).decode("utf-32-be", "surrogatepass")
    if tag == "n":
        return _float_of(node)
    if tag == "b":
        return bytes.fromhex(items[0])
    if tag == "y":
        return bytearray.fromhex(items[0])
    if tag == "o":
        return Opaque(items[0])
    if tag == "c":
        if len(items) != 2:
            raise ValueError("not a value")
        return complex(_float_of(items[0]), _float_of(items[1]))
    if tag == "d":
        if not all(type(pair) is list and len(pair) == 2 for pair in items):
            raise ValueError("not a value")
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in items}
    values = [decode(item, depth + 1) for item in items]
    if tag == "l":
        return values
    if tag == "t":
        return tuple(values)
    if tag == "s":
        return set(values)
    if tag == "f":
        return frozenset(values)
    raise ValueError("not a value")


# -- messages ------------------------------------------------------------------------------------


def send(channel: _socket.socket, message: Any) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("ascii")
    channel.sendall(_LENGTH.pack(len(data)) + data)


def receive(channel: _socket.socket, ended: int | None = None) -> Any:
    """The next message, or None when the other side has gone (the channel's end of file; or,
    with `ended`, a pidfd of the program's process, once that process has ended and nothing is
    waiting). Raises ValueError for what is not a message."""
    if ended is not None:
        import select

        ready = select.select([channel.fileno(), ended], [], [])[0]
        if channel.fileno() not in ready:
            return None
    head = _exactly(channel, _LENGTH.size)
    if head is None:
        return None
    (size,) = _LENGTH.unpack(head)
    if size > _MOST_BYTES:
        raise ValueError(f"a message of {size} bytes")
    data = _exactly(channel, size)
    if data is None:
        return None
    return json.loads(data)


def _exactly(channel: _socket.socket, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = channel.recv(min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


# -- the program's side --------------------------------------------------------------------------


def serve(channel_fd: int) -> NoReturn:
    """The program's process: run ./program.py as __main__; then, once it has returned, say
    "ready" and answer the judge's calls until the judge has gone. A process the program forked
    that runs the program to its end too ends there: it is not the program."""
    me = os.getpid()
    channel = _socket.socket(fileno=channel_fd)
    os.set_inheritable(channel_fd, False)  # the processes the program starts do not hold it
    del sys.argv[1:]
    sys.argv[0] = "program.py"
    with open("program.py", encoding="utf-8") as f:
        code = compile(f.read(), "program.py", "exec")
    namespace = {"__name__": "__main__", "__file__": "program.py", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except SystemExit as e:
        sys.stderr.write(f"SystemExit: the program exited ({e.code!r}) before its last statement returned\n")
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    if os.getpid() != me:
        os._exit(0)
    send(channel, ["ready"])
    while True:
        request = receive(channel)
        if request is None:
            sys.stdout.flush()
            os._exit(0)
        reply = _answer(namespace, request)
        send(channel, reply)
        if reply[0] == "exit":
            os._exit(1)


def _answer(namespace: dict[str, Any], request: Any) -> list[Any]:
    """The reply to ["call", name, args, kwargs]: ["ok", result, args after the call or None
    when unchanged], ["raise", type name, args, text], or ["exit", type name, code] after which
    the process ends (a SystemExit or another BaseException: the program exited)."""
    _, name, args, kwargs = request
    try:
        function = namespace[name]
    except KeyError:
        return ["raise", "NameError", ["l", f"name {name!r} is not defined"], f"name {name!r} is not defined"]
    arguments, keywords = decode(args), decode(kwargs)
    try:
        result = function(*arguments, **keywords)
        after = encode(arguments, strict=False)
        return ["ok", encode(result, strict=False), None if after == args else after]
    except Exception as e:
        try:
            raised = encode(list(e.args), strict=False)
        except Exception:
            raised = ["l"]
        return ["raise", type(e).__name__, raised, str(e)[:1000]]
    except BaseException as e:
        sys.stdout.flush()
        return ["exit", type(e).__name__, repr(getattr(e, "code", None))[:100]]


# -- the judge's side ----------------------------------------------------------------------------


class _Ended(BaseException):
    """The program's process ended, or broke the channel, during the test: nothing the test does
    can catch it as an ordinary exception, and the verdict is failed whatever follows."""


class Remote:
    """A function of the program's, as the test sees it: called with plain data, it returns
    plain data (or raises the exception the program raised, by its type's name)."""

    def __init__(self, name: str, link: _Link) -> None:
        self.__name__ = name
        self._link = link

    def __repr__(self) -> str:
        return f"<the program's {self.__name__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call(self.__name__, args, kwargs)


class _Link:
    """The judge's end of the channel, and whether the program has gone (then every later call fails too)."""

    def __init__(self, channel: _socket.socket, ended: int | None) -> None:
        self.channel = channel
        self.ended = ended
        self.gone: str | None = None

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.gone is not None:
            raise _Ended(self.gone)
        request = ["call", name, ["l", *(encode(a) for a in args)], encode(kwargs)]
        try:
            send(self.channel, request)
            reply = receive(self.channel, self.ended)
            kind = reply[0] if type(reply) is list and reply and type(reply[0]) is str else None
        except Exception:  # the program's process has gone, or sent what is not a message: the channel is broken
            kind = None
        if kind == "ok" and len(reply) == 3:
            try:
                result = decode(reply[1])
                after = None if reply[2] is None else decode(reply[2])
            except Exception:
                after, kind = None, None
            else:
                if type(after) is list and len(after) == len(args):
                    for old, new in zip(args, after):
                        _update(old, new)
                return result
        if kind == "raise" and len(reply) == 4 and type(reply[1]) is str and type(reply[3]) is str:
            raise _exception(reply[1], reply[2], reply[3])
        if kind == "exit" and len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str:
            self.gone = f"{reply[1][:50]}: the program exited ({reply[2][:50]}) before its test returned"
        else:
            self.gone = ENDED
        raise _Ended(self.gone)


def _update(old: Any, new: Any) -> None:
    """An argument the program changed, changed in place in the test's hands."""
    if type(old) is list and type(new) is list or type(old) is bytearray and type(new) is bytearray:
        old[:] = new
    elif type(old) is dict and type(new) is dict or type(old) is set and type(new) is set:
        old.clear()
        old.update(new)


def _exception(name: str, args: Any, text: str) -> Exception:
    """The program's exception in the judge: a built-in type of that name where there is one
    (so a test expecting ValueError sees ValueError), else a new Exception class of that name."""
    kind = getattr(builtins, name, None)
    try:
        values = decode(args)
    except Exception:
        values = [text]
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(*values) if type(values) is list else kind(text)
        except Exception:
            return kind(text) if kind is not UnicodeError else Exception(text)
    return type(name if name.isidentifier() else "Exception", (Exception,), {})(text)


def calls(test: str, defined: Any, entry_point: str | None) -> list[str]:
    """The names `test` reads that are the program's: the entry point, and every other it reads
    that neither the builtins nor the task's own code (`defined`) provides. The test's own
    definitions bound over them when it runs."""
    import ast

    read = {n.id for n in ast.walk(ast.parse(test)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    names = {n for n in read if n not in defined and not hasattr(builtins, n)}
    if entry_point is not None:
        names.add(entry_point)
    return sorted(names)


def judge(channel_fd: int, test: str | None, context: str, entry_point: str | None, program_pid: int | None) -> str | None:
    """The judge's process: wait until the program's process says it is ready, then run the
    task's own code (`context`, whose names the program cannot replace) and the test, each name of
    the program's a `Remote`. Returns None when the test's last statement returned, `ENDED` when
    the program's process ended or broke the channel first, else the line that says why it failed."""
    channel = _socket.socket(fileno=channel_fd)
    try:
        ended: int | None = os.pidfd_open(program_pid) if program_pid is not None else None
    except (AttributeError, OSError):  # kernels before 5.3: the channel's end alone
        ended = None
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        code = None if test is None else compile(test, "test.py", "exec")
        if context:
            exec(compile(context, "task.py", "exec"), namespace)
    except BaseException as e:
        return "the task's own code: " + _line(e)
    link = _Link(channel, ended)
    for name in [] if test is None else calls(test, namespace, entry_point):  # while the program starts
        namespace[name] = Remote(name, link)
    try:
        if receive(channel, ended) != ["ready"]:
            return ENDED
    except Exception:  # what is not a message
        return ENDED
    if code is None:
        return None
    try:
        exec(code, namespace)
    except _Ended:
        pass
    except BaseException as e:
        if link.gone is None:
            return _line(e)
    return link.gone


def _line(e: BaseException) -> str:
    """An exception as the last line of its traceback says it."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
