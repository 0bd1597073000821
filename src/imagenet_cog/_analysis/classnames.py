"""What a text tower reads for zero-shot classification: each concept's name and the prompt
templates, as files a user can read and replace.

**Class names.** A concept's name is its first WordNet lemma made readable: underscores become
spaces and WordNet's capitals stay (proper nouns and abbreviations: "German shepherd", "CD
player"). Names that are equal within a domain, ignoring case, are told apart, each concept of
the group by the first of these that no other concept of the group shares:

1. ``hypernym``: its WordNet parent, "crane (wading bird)" and "crane (lifting device)";
2. ``lemma``: another of its lemmas, often the scientific name, "two-toed sloth (Choloepus
   didactylus)";
3. ``definition``: its WordNet definition up to the first semicolon;
4. ``wnid``: its wnid (only where the definitions are equal too).

Each domain is a classification of its own (IN-1K, then each level), so a name needs to be
unique within its domain only. The names of the official domains ship with the package
(``data/zeroshot_classnames.tsv``, written by :func:`class_names` and checked against it by
the tests); :func:`read_class_names` reads that file or a user's replacement: one
``wnid<TAB>name`` per line, more columns ignored, ``#`` comments.

**Templates.** A prompt template holds ``{c}`` where the class name goes ("a photo of a {c}.").
The default is the 80 ImageNet templates of OpenAI's CLIP (``OPENAI_IMAGENET_TEMPLATES`` of
OpenCLIP's zero-shot metadata), read from the installed OpenCLIP, else from the copy the
package ships (``data/zeroshot_templates_imagenet.txt``); :func:`read_templates` reads a
replacement: one template per line, ``#`` comments.
"""

from __future__ import annotations

import collections
import hashlib

from .._base import WNID_RE, data_path
from .._fileio import atomic_write_text

__all__ = [
    "CLASSNAMES_FILE",
    "TELLING_APART",
    "TEMPLATES_FILE",
    "ambiguity_counts",
    "class_names",
    "default_templates",
    "official_domains",
    "official_header",
    "prompt",
    "read_class_names",
    "read_templates",
    "render_class_names",
    "shipped_class_names",
    "texts_sha256",
    "write_class_names",
]

#: The class names of the official domains, in the package's data.
CLASSNAMES_FILE = "zeroshot_classnames.tsv"
#: OpenAI's 80 ImageNet templates, as OpenCLIP 3.3.0 lists them, in the package's data.
TEMPLATES_FILE = "zeroshot_templates_imagenet.txt"
#: How a name shared within a domain is told apart, in the order tried.
TELLING_APART = ("hypernym", "lemma", "definition", "wnid")
_PLACEHOLDER = "{c}"


def _readable(lemma):
    return lemma.replace("_", " ")


def _definition(gloss):
    return gloss.split(";")[0].strip()


def _distinctions(tax, wnid, group):
    """What each way of telling ``wnid`` apart from the rest of ``group`` would add."""
    others = {lemma.lower() for w in group if w != wnid for lemma in tax.lemma_names(w)}
    parents = tax.parents(wnid)
    own = tax.lemma_names(wnid)
    return {
        "hypernym": _readable(tax.lemma_names(parents[0])[0]) if parents else None,
        "lemma": next(
            (
                _readable(x)
                for x in own[1:]
                if x.lower() not in others and x.lower() != own[0].lower()
            ),
            None,
        ),
        "definition": _definition(tax.gloss(wnid)) or None,
        "wnid": wnid,
    }


def _tell_apart(tax, group, base, taken):
    """``{wnid: (name, how)}`` for the concepts of ``group``, which share the name ``base``."""
    found, pending = {}, list(group)
    options = {w: _distinctions(tax, w, group) for w in group}
    for how in TELLING_APART:
        counts = collections.Counter(
            (options[w][how] or "").lower() for w in pending if options[w][how]
        )
        for w in pending:
            extra = options[w][how]
            name = f"{base[w]} ({extra})" if extra else None
            if extra and counts[extra.lower()] == 1 and name.lower() not in taken:
                found[w] = (name, how)
                taken.add(name.lower())
        pending = [w for w in pending if w not in found]
    return found


def class_names(domains, taxonomy=None):
    """Readable, distinct class names for the concepts of each domain.

    Parameters
    ----------
    domains : dict
        ``{domain: wnids}``; names are made distinct within each domain.
    taxonomy : Taxonomy, optional
        WordNet; the package's by default.

    Returns
    -------
    list of dict
        One ``{"wnid", "domain", "name", "lemma", "told_apart_by"}`` per concept, in the order
        given: ``lemma`` is the readable first lemma, ``told_apart_by`` one of
        :data:`TELLING_APART`, or ``""`` for a lemma that was unique in its domain.

    Examples
    --------
    >>> rows = class_names({"in1k": ["n02012849", "n03126707", "n02085620"]})
    >>> [(r["name"], r["told_apart_by"]) for r in rows]
    [('crane (wading bird)', 'hypernym'), ('crane (lifting device)', 'hypernym'), ('Chihuahua', '')]
    """
    if taxonomy is None:
        from ..taxonomy import load_taxonomy

        taxonomy = load_taxonomy()
    rows = []
    for domain, wnids in domains.items():
        wnids = list(wnids)
        if len(set(wnids)) != len(wnids):
            twice = sorted(w for w, n in collections.Counter(wnids).items() if n > 1)
            raise ValueError(f"domain {domain!r} lists {', '.join(twice[:5])} more than once")
        base = {w: _readable(taxonomy.lemma_names(w)[0]) for w in wnids}
        groups = collections.defaultdict(list)
        for w in wnids:
            groups[base[w].lower()].append(w)
        taken = {key for key, group in groups.items() if len(group) == 1}
        named = {}
        for group in groups.values():
            if len(group) == 1:
                named[group[0]] = (base[group[0]], "")
            else:
                named.update(_tell_apart(taxonomy, group, base, taken))
        rows += [
            {
                "wnid": w,
                "domain": domain,
                "name": named[w][0],
                "lemma": base[w],
                "told_apart_by": named[w][1],
            }
            for w in wnids
        ]
    return rows


def ambiguity_counts(rows):
    """``{domain: {"names": n, "concepts": m, <how>: count}}``: the names shared within each
    domain, the concepts they named, and how many of those each way told apart.

    Examples
    --------
    >>> ambiguity_counts(class_names({"in1k": ["n02012849", "n03126707"]}))
    {'in1k': {'names': 1, 'concepts': 2, 'hypernym': 2}}
    """
    out = {}
    for domain in dict.fromkeys(r["domain"] for r in rows):
        mine = [r for r in rows if r["domain"] == domain and r["told_apart_by"]]
        names = {r["lemma"].lower() for r in mine}
        counts = collections.Counter(r["told_apart_by"] for r in mine)
        out[domain] = {"names": len(names), "concepts": len(mine)}
        out[domain].update({how: counts[how] for how in TELLING_APART if counts[how]})
    return out


def official_domains():
    """``{"in1k": the 1000 IN-1K wnids, "L1": ..., "L5": ...}``, each sorted."""
    from ..levels import load_levels
    from ..taxonomy import imagenet1k_wnids

    levels = load_levels()
    return {"in1k": list(imagenet1k_wnids()), **{n: sorted(levels[n]) for n in levels.names}}


def render_class_names(rows, header=()):
    """The text of a class-names file: ``header`` lines as ``#`` comments, then one
    tab-separated row per concept (see :func:`class_names`)."""
    lines = [f"# {line}" for line in header]
    columns = ("wnid", "domain", "name", "lemma", "told_apart_by")
    lines.append("\t".join(columns))
    for r in rows:
        if any(c in r["name"] for c in "\t\r\n"):
            raise ValueError(f"the class name {r['name']!r} holds a tab or a line break")
        lines.append("\t".join(str(r[c]) for c in columns))
    return "\n".join(lines) + "\n"


def official_header(rows):
    """The provenance lines of the shipped file of the official domains' names."""
    counts = ambiguity_counts(rows)
    told = ", ".join(
        f"{domain} {c['names']} names for {c['concepts']} concepts ("
        + ", ".join(f"{c[how]} by {how}" for how in TELLING_APART if how in c)
        + ")"
        for domain, c in counts.items()
    )
    return (
        "Class names of the ImageNet-CoG domains for zero-shot classification: IN-1K and the",
        "official levels L1-L5, 1000 concepts each. Made by imagenet_cog's class_names from",
        "WordNet 3.0 (data/wordnet30_nouns.tsv.gz): each concept's first lemma, underscores made",
        "spaces, WordNet's case kept; a name shared within a domain is told apart by the",
        "hypernym, else another lemma, else the definition (up to ';'), else the wnid.",
        f"Shared names: {told}.",
        "Replace the file with your own (wnid<TAB>name per line) to evaluate with other names.",
    )


def write_class_names(path, rows, header=()):
    """Write :func:`render_class_names` to ``path`` atomically."""
    atomic_write_text(path, render_class_names(rows, header))


def read_class_names(path, option="--classnames"):
    """``{wnid: name}`` from a class-names file: ``wnid<TAB>name`` per line, more columns
    ignored, ``#`` comments and blank lines skipped; a header line starting ``wnid<TAB>``
    names the columns, and the one called ``name`` holds the names (the shipped file's).

    Raises
    ------
    ValueError
        In one line naming the file, the line and ``option``: a line that is not a wnid and
        a name, or a wnid given twice.
    """
    names, column = {}, 1
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split("\t")
            if fields[0] == "wnid":  # a header: the column called "name", else the second
                column = fields.index("name") if "name" in fields else 1
                continue
            where = f"{path}, line {number}"
            if len(fields) <= column or not WNID_RE.match(fields[0]) or not fields[column].strip():
                raise ValueError(
                    f"{where}: expected a wnid, a tab and a class name, got {line[:80]!r} "
                    f"(fix the file given to {option})"
                )
            if fields[0] in names:
                raise ValueError(
                    f"{where}: {fields[0]} is named twice (fix the file given to {option})"
                )
            names[fields[0]] = fields[column].strip()
    return names


def shipped_class_names():
    """``{wnid: name}`` of the official domains, from the package's data."""
    return read_class_names(data_path(CLASSNAMES_FILE), option="the package's class names")


def _check_template(template, where, option):
    if template.count(_PLACEHOLDER) != 1:
        raise ValueError(
            f"{where}: a template holds {_PLACEHOLDER} once, where the class name goes, got "
            f"{template!r} (fix the file given to {option})"
        )


def read_templates(path, option="--templates"):
    """The prompt templates of a file: one per line, each with ``{c}`` once; ``#`` comments
    and blank lines skipped."""
    templates = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            _check_template(line, f"{path}, line {number}", option)
            templates.append(line)
    if not templates:
        raise ValueError(f"{path} holds no template (fix the file given to {option})")
    return templates


def default_templates():
    """``(templates, source)``: OpenAI's ImageNet templates from the installed OpenCLIP, else
    the package's copy of them."""
    try:
        from open_clip import __version__
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
    except ImportError:
        return read_templates(data_path(TEMPLATES_FILE), "the package's templates"), (
            f"imagenet_cog data/{TEMPLATES_FILE}"
        )
    templates = []
    for make in OPENAI_IMAGENET_TEMPLATES:
        template = make(_PLACEHOLDER) if callable(make) else str(make)
        _check_template(template, "OpenCLIP's OPENAI_IMAGENET_TEMPLATES", "templates")
        templates.append(template)
    return templates, f"open_clip {__version__} zero_shot_metadata.OPENAI_IMAGENET_TEMPLATES"


def prompt(template, name):
    """``template`` with the class name in place of ``{c}``.

    Examples
    --------
    >>> prompt("a photo of a {c}.", "crane (wading bird)")
    'a photo of a crane (wading bird).'
    """
    return template.replace(_PLACEHOLDER, name)


def texts_sha256(texts):
    """sha256 of a list of texts in order (names, templates): what a cache key holds."""
    h = hashlib.sha256()
    for text in texts:
        data = str(text).encode("utf-8")
        h.update(b"%d:" % len(data) + data)
    return h.hexdigest()
