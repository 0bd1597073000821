"""The HTML of the report: escaped text, tables whose columns sort, and the page that holds
its styles and its script inline, so that it opens offline and fetches nothing.

Stage "results", the HTML report's own module.
"""

from __future__ import annotations

import html
from importlib import resources

__all__ = ["Cell", "breakable", "esc", "page", "table"]


def esc(text):
    """``text`` for HTML: ``&``, ``<``, ``>`` and quotes escaped.

    Examples
    --------
    >>> esc('<b>"x"</b>')
    '&lt;b&gt;&quot;x&quot;&lt;/b&gt;'
    """
    return html.escape(str(text), quote=True)


def breakable(text):
    """``text`` escaped for HTML, with a line break allowed after each underscore: a model's
    name (``efficientnet_lite0-checkpoint-95a885f6``) breaks at its dashes and underscores
    rather than push a table's last columns out of the page.

    Examples
    --------
    >>> breakable("mobilenet_v2 <x>")
    'mobilenet_<wbr>v2 &lt;x&gt;'
    """
    return esc(text).replace("_", "_<wbr>")


class Cell:
    """A table cell: its text, the value it sorts by, a CSS class, a tooltip and an id; its
    text may break after an underscore (:func:`breakable`).

    Examples
    --------
    >>> Cell("57.6 ± 0.1", 57.6).html()
    '<td data-sort="57.6">57.6 ± 0.1</td>'
    """

    def __init__(self, text, sort=None, css=None, title=None, raw=False, ident=None):
        self.text, self.sort, self.css, self.title, self.raw = text, sort, css, title, raw
        self.ident = ident

    def html(self, tag="td"):
        attrs = f' id="{esc(self.ident)}"' if self.ident else ""
        if self.sort is not None:
            attrs += f' data-sort="{esc(self.sort)}"'
        if self.css:
            attrs += f' class="{esc(self.css)}"'
        if self.title:
            attrs += f' title="{esc(self.title)}"'
        body = self.text if self.raw else breakable(self.text)
        return f"<{tag}{attrs}>{body}</{tag}>"


def table(header, rows, css="sortable", ident=None, row_attrs=None):
    """A ``<table>``: ``header`` a list of texts (or Cells), ``rows`` lists of texts or
    :class:`Cell`; ``row_attrs`` the attributes of each row (``{"class": "mine"}``).

    Examples
    --------
    >>> table(["model", "L5"], [["mine", Cell("57.6", 57.6)]]).count("<tr")
    2
    """
    head = "".join((h if isinstance(h, Cell) else Cell(h)).html("th") for h in header)
    lines = []
    for i, row in enumerate(rows):
        attrs = ""
        for key, value in ((row_attrs or [{}] * len(rows))[i] or {}).items():
            attrs += f' {key}="{esc(value)}"'
        cells = "".join((c if isinstance(c, Cell) else Cell(c)).html() for c in row)
        lines.append(f"<tr{attrs}>{cells}</tr>")
    ident = f' id="{esc(ident)}"' if ident else ""
    body = "\n".join(lines)
    return (
        f'<table class="{esc(css)}"{ident}>\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{body}\n</tbody>\n</table>"
    )


def _asset(name):
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def page(title, body):
    """The whole page: ``body`` (HTML) with the report's styles and script inline. Its
    Content-Security-Policy lets it load nothing from anywhere: no font, image, style or
    script but its own.

    Examples
    --------
    >>> page("t", "<p>x</p>").startswith("<!DOCTYPE html>")
    True
    """
    # The script is the page's own, so its hash could be pinned; 'unsafe-inline' with no
    # source allowed keeps the policy readable, and connect-src 'none' forbids any request.
    policy = (
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
        "img-src data:; font-src 'none'; connect-src 'none'"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>\n{_asset('report.css')}</style>\n</head>\n"
        f"<body>\n{body}\n<script>\n{_asset('report.js')}</script>\n</body>\n</html>\n"
    )
