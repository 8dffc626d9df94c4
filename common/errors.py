"""The one exception type that means "the user gave bad input"."""


class UserError(Exception):
    """Bad input from the user. The CLI prints the message alone, with no traceback.

    Messages name what is wrong and where: the file, the line and the field when there is one.
    """


def where(path, lineno=None, field=None) -> str:
    """`path:line: field 'x'` prefix for error messages."""
    out = str(path)
    if lineno is not None:
        out += f":{lineno}"
    if field is not None:
        out += f": field '{field}'"
    return out
