"""Usage and help text."""

import textwrap


def _option_label(option):
    label = ", ".join(sorted(option.flags, key=len))
    if option.takes_value:
        label += " " + (option.metavar or option.dest.upper())
    return label


def usage(parser):
    """``usage: prog [options] target [extra]``."""
    parts = [f"usage: {parser.prog}"]
    if parser.options:
        parts.append("[options]")
    for argument in parser.arguments:
        parts.append(f"[{argument.name}]" if argument.optional else argument.name)
    return " ".join(parts)


def render_help(parser, width=80):
    """The full help screen: usage, description, arguments and options, wrapped to ``width``."""
    lines = [usage(parser)]
    if parser.description:
        lines.append("")
        lines.extend(textwrap.wrap(parser.description, width))
    rows = [(argument.name, argument.help) for argument in parser.arguments]
    option_rows = []
    for option in parser.options:
        text = option.help
        if option.default not in (None, False, [], ()):
            text = f"{text} (default: {option.default})".strip()
        option_rows.append((_option_label(option), text))
    column = min(24, max((len(label) for label, _ in rows + option_rows), default=0) + 4)
    for title, section in (("arguments", rows), ("options", option_rows)):
        if not section:
            continue
        lines.extend(["", f"{title}:"])
        for label, text in section:
            wrapped = textwrap.wrap(text, max(width - column, 20)) or [""]
            first = f"  {label}".ljust(column)
            if len(first) > column:
                lines.append(first.rstrip())
                first = " " * column
            lines.append((first + wrapped[0]).rstrip())
            lines.extend(" " * column + extra for extra in wrapped[1:])
    return "\n".join(lines) + "\n"
