"""Fonts for plot labels: Latin text in matplotlib's DejaVu Sans, CJK text in a font that has it.

Matplotlib's bundled DejaVu Sans has no Chinese characters, so labels like 我吃了一个红苹果
would come out as empty boxes. ``font_families`` looks at the characters a figure will show
and adds, as a fallback family, the first font that covers the rest:

1. the Noto Sans CJK font shipped by the ``cvttf-NotoSansCJK-Regular`` package (a dependency,
   so every install has it),
2. any CJK font the system has (``fc-list :lang=zh`` lists them; matplotlib sees the same
   font folders), e.g. Debian's fonts-noto-cjk or fonts-wqy-zenhei.

If no font covers some characters, a warning names them instead of drawing silent boxes.
"""

from __future__ import annotations

import functools
import unicodedata
import warnings

from ..tokenizers.fitting import is_cjk

BASE_FAMILY = "DejaVu Sans"
# Family names of CJK fonts commonly installed by operating systems.
SYSTEM_CJK_HINTS = ("cjk", "wenquanyi", "wqy", "source han", "droid sans fallback", "ar pl",
                    "simhei", "simsun", "yahei", "pingfang", "hiragino", "heiti", "songti",
                    "noto sans sc", "noto sans tc", "noto serif sc", "zen hei", "micro hei")


class MissingGlyphWarning(UserWarning):
    """Some label characters have no glyph in any font found; they will show as boxes."""


@functools.cache
def _charmap(path: str) -> frozenset[int]:
    from matplotlib import ft2font

    try:
        return frozenset(ft2font.FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


def _packaged_cjk_font() -> str | None:
    """The font file of the CJK font package, if it is installed."""
    try:
        import cvttf_NotoSansCJK_Regular as pkg
    except ImportError:
        return None
    try:
        return pkg.get_TTF_path()
    except (OSError, FileNotFoundError):
        return None


def cjk_font_file() -> str | None:
    """The packaged CJK font's file (an OpenType font of about 16 MB), or None without it."""
    return _packaged_cjk_font()


@functools.cache
def _candidates() -> tuple[str, ...]:
    """Font files to try for characters DejaVu Sans lacks, best first."""
    from matplotlib import font_manager

    paths = []
    packaged = _packaged_cjk_font()
    if packaged:
        paths.append(packaged)
    for entry in font_manager.fontManager.ttflist:
        if any(h in entry.name.lower() for h in SYSTEM_CJK_HINTS) and entry.fname not in paths:
            paths.append(entry.fname)
    return tuple(paths)


def _family_of(path: str) -> str:
    """Register a font file with matplotlib and return its family name."""
    from matplotlib import font_manager

    if not any(e.fname == path for e in font_manager.fontManager.ttflist):
        font_manager.fontManager.addfont(path)
    return font_manager.FontProperties(fname=path).get_name()


def font_families(texts) -> list[str]:
    """The ``font.family`` list that renders every character of ``texts`` (a fallback chain).

    Warns with ``MissingGlyphWarning`` naming the characters no font found here can draw.
    """
    return font_chain(texts)[0]


def font_chain(texts) -> tuple[list[str], set[int]]:
    """(``font_families``' list, the code points none of its fonts has), warning as it does."""
    from matplotlib import font_manager

    needed = {ord(ch) for text in texts for ch in str(text) if drawn(ch)}
    base = _charmap(font_manager.findfont(BASE_FAMILY))
    missing = needed - base
    families = [BASE_FAMILY]
    for path in _candidates():
        if not missing:
            break
        covers = missing & _charmap(path)
        if covers:
            families.append(_family_of(path))
            missing -= covers
    if missing:
        shown = "".join(sorted(chr(c) for c in missing)[:20])
        advice = ("Install a CJK font (pip install cvttf-NotoSansCJK-Regular, or apt-get "
                  "install fonts-noto-cjk) and run again") if any(map(is_cjk, map(chr, missing))) \
            else "No font found here has them (and matplotlib draws no colour emoji)"
        warnings.warn(f"no font here has the characters {shown!r}: they will show as boxes. "
                      f"{advice}", MissingGlyphWarning, stacklevel=3)
    return families, missing


def drawn(ch: str) -> bool:
    """Whether ``ch`` needs a glyph: not a space, a control or format character (the zero-width
    joiner of emoji sequences) or a variation selector, which fonts draw as nothing."""
    o = ord(ch)
    return not (ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")
                or 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF)


def is_wide(ch: str) -> bool:
    """CJK and other East Asian characters (from U+2E80 on), which common Latin fonts lack."""
    return ord(ch) >= 0x2E80


def cjk_webfont(chars) -> bytes | None:
    """A small WOFF font with just ``chars`` cut from the packaged CJK font, or None.

    An HTML page embeds it so its Chinese text renders on machines without CJK fonts
    (a few kilobytes for a sentence, instead of the 16 MB font).
    """
    import io

    wanted = "".join(sorted({ch for ch in chars if is_wide(ch)}))
    path = _packaged_cjk_font()
    if not wanted or path is None:
        return None
    from fontTools import subset
    from fontTools.ttLib import TTFont

    options = subset.Options()
    options.layout_features = []
    options.name_IDs = [1, 2]
    options.notdef_outline = True
    font = TTFont(path, lazy=True)
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=wanted)
    subsetter.subset(font)
    font.flavor = "woff"
    buf = io.BytesIO()
    font.save(buf)
    return buf.getvalue()
