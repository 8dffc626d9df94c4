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


def shown(value) -> str:
    """A value as an error message shows it: its repr, cut short at every level (reprlib), so
    that a long list, or a YAML alias that expands exponentially, is never written out whole."""
    import reprlib
    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlevel = 60, 60, 2
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 4
    return r.repr(value)
