"""The socket ABCI protocol: length-prefixed protobuf ``Request``/``Response`` on a Unix socket.

CometBFT's socket client opens one connection per ABCI connection (consensus, mempool, query,
snapshot) and writes, on each, requests framed as an unsigned varint length followed by the
encoded ``cometbft.abci.v1.Request``; it expects one framed ``Response`` per request, in order,
and a ``Flush`` request asks for everything written so far. The messages are the generated
protobuf classes (``pb/``, see ``scripts/gen-abci-proto``); only the varint frame is written
here. A frame over :data:`MAX_FRAME_BYTES`, a bad varint or a request that does not decode
closes that connection (CometBFT then stops: its app is broken, and it must not go on alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Final

from google.protobuf.message import DecodeError as ProtobufDecodeError

from ...errors import DecodeError
from .handler import LedgerApp
from .pb.cometbft.abci.v1 import types_pb2 as abci

__all__ = ["MAX_FRAME_BYTES", "AbciServer", "encode_frame", "read_frame"]

logger = logging.getLogger("gradfed_ipfs.cometbft.abci")

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
"""Largest ABCI message accepted, in bytes: a FinalizeBlock of a 4 MiB block fits."""
_MAX_VARINT_BYTES: Final = 10


def encode_frame(message: bytes) -> bytes:
    """Prefix ``message`` with its length as an unsigned LEB128 varint."""
    length, prefix = len(message), bytearray()
    while length >= 0x80:
        prefix.append((length & 0x7F) | 0x80)
        length >>= 7
    prefix.append(length)
    return bytes(prefix) + message


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes | None:
    """Read one framed message; ``None`` at a clean end of stream.

    Raises
    ------
    DecodeError
        If the varint is too long, the length over ``limit``, or the stream ends mid-frame.
    """
    length = shift = 0
    for position in range(_MAX_VARINT_BYTES):
        byte = await reader.read(1)
        if not byte:
            if position == 0:
                return None
            raise DecodeError("ABCI stream ended inside a frame length")
        length |= (byte[0] & 0x7F) << shift
        shift += 7
        if not byte[0] & 0x80:
            break
    else:
        raise DecodeError("ABCI frame length is not a varint of at most 10 bytes")
    if length > limit:
        raise DecodeError(f"ABCI frame of {length} bytes > {limit}")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise DecodeError(f"ABCI stream ended after {len(exc.partial)} of {length} bytes") from None


class AbciServer:
    """Serve one :class:`LedgerApp` on a Unix socket to one CometBFT node.

    Parameters
    ----------
    socket_path
        Where to listen (removed and re-made at :meth:`start`; at most ~100 characters).
    app
        The application; a fresh :class:`LedgerApp` when ``None``.
    """

    def __init__(self, socket_path: str | Path, app: LedgerApp | None = None) -> None:
        self.socket_path = Path(socket_path)
        self.app = app if app is not None else LedgerApp()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Listen on the socket (mode 0600 by the umask of a private home directory)."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.socket_path), limit=1 << 16
        )

    async def serve_forever(self) -> None:
        """Start (if needed) and serve until cancelled."""
        if self._server is None:
            await self.start()
        server = self._server
        if server is None:  # closed meanwhile
            return
        async with server:
            await server.serve_forever()

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while (frame := await read_frame(reader)) is not None:
                request = abci.Request()
                try:
                    request.ParseFromString(frame)
                except ProtobufDecodeError as exc:
                    raise DecodeError(f"ABCI request does not decode: {exc}") from exc
                response = self.app.handle(request)
                writer.write(encode_frame(response.SerializeToString()))
                if request.WhichOneof("value") == "flush":
                    await writer.drain()
        except DecodeError as exc:
            logger.error("closing an ABCI connection: %s", exc)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
