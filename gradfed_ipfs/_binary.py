"""A pinned external binary built by a script of this repository (Kubo, CometBFT).

Order: the override environment variable if set; the per-user cache
(``$XDG_CACHE_HOME/gradfed-ipfs/<tool>/<version>/<file>``); otherwise the ``scripts/install-*``
script of the source checkout this package runs from, which builds it from the Go module proxy.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import GradfedError

__all__ = ["PinnedBinary"]


@dataclass(frozen=True)
class PinnedBinary:
    """Where one pinned tool lives and how it is built.

    Attributes
    ----------
    name
        The tool's name in messages (``"Kubo"``).
    version
        The pinned version (``"v0.43.1"``).
    folder, filename
        Its cache folder and file name (``kubo``, ``ipfs``).
    script
        The build script in ``scripts/`` (``install-kubo``).
    override
        The environment variable naming another binary (``GRADFED_KUBO_BIN``).
    missing
        The error raised when there is none.
    hint
        Appended to the "no binary" message (another way to go on).
    """

    name: str
    version: str
    folder: str
    filename: str
    script: str
    override: str
    missing: type[GradfedError]
    hint: str = ""

    def default_path(self, version: str | None = None) -> Path:
        """Return where the build script puts the binary (under ``$XDG_CACHE_HOME``)."""
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cache / "gradfed-ipfs" / self.folder / (version or self.version) / self.filename

    def script_path(self) -> Path | None:
        """Return the build script of the source checkout this package runs from, if any."""
        candidate = Path(__file__).resolve().parents[1] / "scripts" / self.script
        return candidate if candidate.is_file() else None

    def find(self, *, build: bool = True) -> Path:
        """Return the path of a runnable binary, running the build script if ``build``.

        Raises
        ------
        GradfedError
            Of type ``missing``: no binary, and none could be built.
        """
        chosen = os.environ.get(self.override)
        path = Path(chosen) if chosen else self.default_path()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        script = self.script_path()
        if build and script is not None:
            result = subprocess.run(
                [str(script)], capture_output=True, text=True, check=False, timeout=1800
            )
            out = result.stdout.strip()
            built = Path(out.splitlines()[-1]) if out else None
            if result.returncode == 0 and built is not None and built.is_file():
                return built
            raise self.missing(
                f"building {self.name} {self.version} with {script} failed "
                f"(exit {result.returncode}):\n" + "\n".join(result.stderr.splitlines()[-20:])
            )
        raise self.missing(
            f"no {self.name} binary at {path}; run scripts/{self.script} (builds {self.name} "
            f"{self.version} from the Go module proxy) or set {self.override}{self.hint}"
        )
