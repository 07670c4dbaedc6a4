"""``python -m gradfed_ipfs.cometbft.abci --socket PATH``: one validator's ABCI app process.

Serves a fresh :class:`~gradfed_ipfs.cometbft.abci.handler.LedgerApp` (state in memory: after a
restart CometBFT replays its stored blocks into it) until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from .server import AbciServer


async def _main(socket_path: str) -> None:
    server = AbciServer(socket_path)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    serving = asyncio.create_task(server.serve_forever())
    await stop.wait()
    serving.cancel()
    await server.close()


def main() -> None:
    """Parse ``--socket`` and serve."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    asyncio.run(_main(parser.parse_args().socket))


if __name__ == "__main__":
    main()
