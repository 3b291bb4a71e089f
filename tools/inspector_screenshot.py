"""Take a screenshot of the inspector's request list on a journal, headless, as the README shows it.

    python -m tools.build_journal /tmp/priced.db --requests 2000 --price-table prices.toml
    python -m tools.inspector_screenshot /tmp/priced.db docs/inspector-list.svg

The inspector runs under Textual's pilot at a fixed terminal size, its first page loaded, and
`App.save_screenshot` writes the screen as SVG; a `.png` name converts that SVG with
`rsvg-convert` (librsvg).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
from pathlib import Path

from replay.inspector.app import InspectorApp


async def screenshot(journal: Path, out: Path, size: tuple[int, int]) -> None:
    """Save the inspector's list of `journal` at `size` (columns, lines) as `out` (SVG)."""
    app = InspectorApp(journal, refresh_s=0)
    async with app.run_test(size=size) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.inspector_screenshot", description=__doc__)
    parser.add_argument("journal", type=Path)
    parser.add_argument("out", type=Path, help="an .svg, or a .png (converted with rsvg-convert)")
    parser.add_argument("--size", default="184x30", help="terminal columns x lines")
    parser.add_argument("--zoom", type=float, default=1.0, help="PNG scale")
    args = parser.parse_args(argv)
    columns, lines = (int(n) for n in args.size.split("x"))
    if args.out.suffix != ".png":
        asyncio.run(screenshot(args.journal, args.out, (columns, lines)))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        svg = Path(scratch) / "screen.svg"
        asyncio.run(screenshot(args.journal, svg, (columns, lines)))
        subprocess.run(["rsvg-convert", "--zoom", str(args.zoom), "-o", str(args.out), str(svg)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
