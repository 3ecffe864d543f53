"""The socket side of a stream connection (issue 32): each connection's socket read straight into one fixed
area mapped outside ``malloc``, a frame (a 4-byte size, then that many bytes) copied out of it once.

asyncio's own reader takes each read as a new ``bytes`` of up to 256 KiB, appends it to a ``bytearray`` that
grows and shrinks with what is unread, and copies each frame out again.  Each large block freed raises glibc's
mmap threshold to its size, after which such blocks come from the heap and leave holes in it: a week-long
service's RSS grew with them (+6 % in 45 minutes of the soak while ``malloc`` in use stayed flat).  Reading into
one fixed area per connection also saves a copy and an allocation per read (bench/consume.py).

Standard library only: the rstream seam reads its frames here (``_rstream/frames.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["READ_AREA", "FrameProtocol", "FrameReader", "open_frames"]

#: a connection's read area: a frame up to ``READ_AREA - _LOW - 4`` bytes is read in it, a larger one into a
#: buffer of its own
READ_AREA = 1 << 20
_LOW = 1 << 16  # the least room the socket is read into
#: the largest frame taken: a size above it is not this protocol (an AMQP or TLS listener's first bytes read as a
#: size: ``AMQP`` is 1.1 GB), and the connection is dropped instead of that much memory taken for it
MAX_FRAME = 1 << 26
_SIZE = struct.Struct(">I")
log = logging.getLogger(__name__)


class FrameReader(asyncio.StreamReader):
    """A connection's reader whose socket is read straight into one fixed area of :data:`READ_AREA` bytes
    (see the module): the transport reads into it (a :class:`~asyncio.BufferedProtocol`), a frame larger than
    it gets a buffer of its own, and reading pauses while the area is full of frames not read yet.  Frames are
    taken with :meth:`frame`; asyncio's ``read*`` methods are not served."""

    # asyncio.StreamReader's own state, used as its own methods use it (typeshed does not declare it)
    _eof: bool
    _exception: BaseException | None
    _loop: asyncio.AbstractEventLoop
    _paused: bool
    _transport: asyncio.Transport | None
    _waiter: asyncio.Future[None] | None
    _wakeup_waiter: Callable[[], None]

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=READ_AREA, loop=loop)
        self._area = mmap.mmap(-1, READ_AREA)
        self._view = memoryview(self._area)
        self._head = 0  # the first byte not read
        self._tail = 0  # the end of what was received
        self._big: memoryview | None = None  # a frame larger than the area, being received into its own buffer
        self._big_got = 0
        self._released = False  # the area handed back (release): nothing more is read

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._released:  # the connection has ended, and what still comes is not read
            return memoryview(bytearray(_LOW))
        if self._big is not None:
            return self._big[self._big_got:]
        if self._tail > READ_AREA - _LOW:  # the unread part moved to the front: never under _LOW free then
            unread = self._tail - self._head
            self._area.move(0, self._head, unread)
            self._head, self._tail = 0, unread
        return self._view[self._tail:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._released:
            return
        if self._big is not None:
            self._big_got += nbytes
            full = self._big_got == len(self._big)  # nothing more to read into before it is taken
        else:
            self._tail += nbytes
            full = READ_AREA - (self._tail - self._head) < _LOW  # of frames not read yet: read once they are
        if full and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wakeup_waiter()

    async def read(self, n: int = -1) -> bytes:
        raise TypeError("a FrameReader hands out whole frames: use frame(), not read()")

    async def readexactly(self, n: int) -> bytes:
        raise TypeError("a FrameReader hands out whole frames: use frame(), not readexactly()")

    async def readline(self) -> bytes:
        raise TypeError("a FrameReader hands out whole frames: use frame(), not readline()")

    async def readuntil(self, separator: Any = b"\n") -> bytes:
        raise TypeError("a FrameReader hands out whole frames: use frame(), not readuntil()")

    def at_eof(self) -> bool:
        return self._eof and self._head == self._tail and self._big is None

    async def frame(self) -> bytes:
        """The next frame, without its size prefix.

        :raises asyncio.IncompleteReadError: the peer closed the connection (or it was lost) before a whole frame
            came, as :meth:`~asyncio.StreamReader.readexactly` raises."""
        while True:
            big = self._big
            if big is None:
                head, tail = self._head, self._tail
                if tail - head >= 4:
                    size = _SIZE.unpack_from(self._area, head)[0]
                    end = head + 4 + size
                    if end <= tail:
                        if end == tail:
                            self._head = self._tail = 0
                        else:
                            self._head = end
                        if self._tail - self._head <= READ_AREA // 2:
                            self._resume()
                        return self._area[head + 4:end]  # bytes: the one copy
                    if size > MAX_FRAME:
                        log.warning("a frame of %d bytes announced (at most %d): not the stream protocol, or a "
                                    "corrupt stream; the connection is dropped", size, MAX_FRAME)
                        if self._transport is not None:
                            self._transport.abort()
                        raise asyncio.IncompleteReadError(b"", size)
                    if size + 4 > READ_AREA - _LOW:  # never fits: its own buffer, what came of it moved there
                        self._big = memoryview(bytearray(size))
                        self._big_got = tail - head - 4
                        self._big[:self._big_got] = self._view[head + 4:tail]
                        self._head = self._tail = 0
                        continue
            elif self._big_got == len(big):
                self._big = None
                self._resume()
                return bytes(big)
            if self._exception is not None or self._eof or self._released:  # (released: head = tail, no big)
                self.release()  # nothing more comes
                raise asyncio.IncompleteReadError(b"", None) from self._exception
            self._resume()  # a frame not complete: it fits, so there is room for the rest
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                raise
            except BaseException:  # the connection was lost while this waited: nothing more comes
                self.release()
                raise
            finally:
                self._waiter = None


    def release(self) -> None:
        """Hand the read area back now: the connection has ended, and nothing more is read from it.  Left to the
        garbage collector, a lost connection's area (1 MiB) waited for a full collection of the cycles its
        connection's objects make, which came every minute or more in the soak.  Idempotent; a frame not read yet
        is dropped."""
        if self._released:
            return
        self._released = True
        # asyncio's TLS layer keeps this reader's protocol (its buffer methods), and the reader's transport is
        # that layer's: a cycle that kept the layer's 256 KiB buffer, the socket and the SSL objects of every
        # ended TLS connection until a full collection.  Nothing is read any more, so the reader lets go of it.
        self._transport = None
        self._head = self._tail = 0
        self._big = None
        self._view.release()
        try:
            self._area.close()
        except BufferError:
            # a slice of the area is still out: a reset connection's error keeps the read that failed, and the
            # slice it read into, in its traceback's frames; those frames are done, so their locals can go
            if self._exception is not None:
                traceback.clear_frames(self._exception.__traceback__)
            with contextlib.suppress(BufferError):  # still out: the collector frees it with its last view
                self._area.close()

    def _resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()


class FrameProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """asyncio's stream protocol (its writer's flow control and close), reading into a :class:`FrameReader`."""

    def __init__(self, reader: FrameReader) -> None:
        super().__init__(reader)
        self._frame_reader = reader

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frame_reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._frame_reader.buffer_updated(nbytes)


async def open_frames(host: str, port: int, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """:func:`asyncio.open_connection`, its socket read by a :class:`FrameReader`.

    Except over TLS before Python 3.11, whose TLS layer hands a buffered protocol what it has decrypted even
    after the protocol paused reading, and on an event loop other than asyncio's selector loop (Windows'
    proactor does the same): there asyncio's own reader reads."""
    loop = asyncio.get_running_loop()
    if (sys.version_info < (3, 11) and kwargs.get("ssl")) or not isinstance(loop, asyncio.SelectorEventLoop):
        # TLS on 3.10, and other loops (Windows' proactor): they hand a buffered protocol data after it paused
        return await asyncio.open_connection(host, port, limit=2 * READ_AREA, **kwargs)
    reader = FrameReader(loop)
    protocol = FrameProtocol(reader)
    transport, _ = await loop.create_connection(lambda: protocol, host, port, **kwargs)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
