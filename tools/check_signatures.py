#!/usr/bin/env python3
"""List every native binary of a bundle folder and check that each one is signed.

    python3 tools/check_signatures.py dist/chat-sidecar [dist/chat-sidecar-parts/vectors ...]
    python3 tools/check_signatures.py --list dist/chat-sidecar      # only list them

A binary is recognised by its first bytes, not its name: Mach-O (macOS: the launcher,
``.dylib``, ``.so``), PE (Windows: ``.exe``, ``.dll``, ``.pyd``), ELF (Linux). Each one is
handed to the platform's verifier, and the check fails (exit 1, naming the files) when any
binary is unsigned or its signature is broken:

- macOS: ``codesign --verify --strict --verbose=2 FILE`` (Developer ID signatures; run
  ``spctl --assess`` on the app for the Gatekeeper verdict after notarisation);
- Windows: ``signtool verify /pa /q FILE`` (Authenticode; signtool from the Windows SDK);
- Linux: ELF files carry no signature a loader checks, so there the check can only list
  them (exit 0, a note says so) unless ``--verifier`` names a command.

``--verifier 'CMD {}'`` replaces the platform's command (``{}`` is the file); exit code 0 means
signed. docs/signing.md says what to sign, in which order.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

MAGIC = {
    b"\x7fELF": "ELF",
    b"MZ": "PE",
    b"\xcf\xfa\xed\xfe": "Mach-O", b"\xce\xfa\xed\xfe": "Mach-O",
    b"\xfe\xed\xfa\xcf": "Mach-O", b"\xfe\xed\xfa\xce": "Mach-O",
    b"\xca\xfe\xba\xbe": "Mach-O",  # universal (fat); also a Java class file, never in a bundle
}
VERIFIERS = {
    "darwin": "codesign --verify --strict --verbose=2 {}",
    "win32": "signtool verify /pa /q {}",
}


def kind_of(path: Path) -> str | None:
    """"ELF", "PE" or "Mach-O" for a native binary, else None."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        return None
    for magic, kind in MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


def binaries(folders: list[Path]) -> list[tuple[Path, str]]:
    """Every native binary under ``folders`` (symlinks left out: their targets are listed)."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                kind = kind_of(path)
                if kind is not None:
                    found.append((path, kind))
    return found


def unsigned(found: list[tuple[Path, str]], verifier: str) -> list[tuple[Path, str]]:
    """The binaries ``verifier`` does not accept, with what it said."""
    bad = []
    for path, _ in found:
        done = subprocess.run(shlex.split(verifier.replace("{}", shlex.quote(str(path)))),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            bad.append((path, said[-1] if said else f"exit {done.returncode}"))
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--list", action="store_true", help="only list the binaries")
    parser.add_argument("--verifier", help="command that exits 0 for a signed file ({} = the file)")
    args = parser.parse_args(argv)
    found = binaries(args.folders)
    for path, kind in found:
        print(f"{kind:6} {path}")
    print(f"{len(found)} native binaries")
    if args.list:
        return 0
    verifier = args.verifier or VERIFIERS.get(sys.platform)
    if verifier is None:
        print("no signature verifier on this platform (ELF is not signed): listed only; pass --verifier to check")
        return 0
    bad = unsigned(found, verifier)
    for path, said in bad:
        print(f"UNSIGNED {path}: {said}", file=sys.stderr)
    print(f"{len(bad)} of {len(found)} binaries are not signed" if bad else f"all {len(found)} binaries are signed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
