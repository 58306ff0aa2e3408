"""CSV lines in the RFC 4180 style.

Fields are separated by ``delimiter``; a field that starts with the quote
character runs to the matching closing quote and may contain delimiters, and a
doubled quote inside it stands for one quote character. Quoted fields cannot
span lines: each line of the input is one row.
"""

from tinyparse.errors import ParseError


def split_row(line, delimiter=",", quote='"'):
    """Split one CSV line into its fields (always at least one field)."""
    if len(delimiter) != 1 or len(quote) != 1:
        raise ValueError("delimiter and quote must be single characters")
    fields = []
    field = []
    in_quotes = False
    index = 0
    while index < len(line):
        char = line[index]
        if in_quotes:
            if char == quote:
                if line[index + 1 : index + 2] == quote:
                    field.append(quote)
                    index += 2
                    continue
                in_quotes = False
            else:
                field.append(char)
        elif char == quote and not field:
            in_quotes = True
        elif char == delimiter:
            fields.append("".join(field))
            field = []
        else:
            field.append(char)
        index += 1
    if in_quotes:
        raise ParseError("unterminated quoted field", column=len(line))
    fields.append("".join(field))
    return fields


def read_rows(text, delimiter=","):
    """All rows of ``text``; blank lines are skipped."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(split_row(line, delimiter))
        except ParseError as exc:
            raise ParseError(exc.message, line=number, column=exc.column) from None
    return rows


def read_records(text, delimiter=","):
    """Rows as dictionaries keyed by the header (the first row).

    Every row must have exactly as many fields as the header.
    """
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        return []
    header = split_row(lines[0][1], delimiter)
    records = []
    for number, line in lines[1:]:
        row = split_row(line, delimiter)
        if len(row) != len(header):
            raise ParseError(f"row has {len(row)} fields, expected {len(header)}", line=number)
        records.append(dict(zip(header, row)))
    return records
