"""Python numbers taken as exactly what they are: an integer argument takes Python's or numpy's
integers, a number argument any real number, a flag a bool. Anything else raises ValueError
naming the argument, where int() would truncate 1.5 or parse "7" and bool() take "no" for True.
"""
import numbers
import operator

import numpy as np


def integer(value, name):
    """value as an int (a bool is refused too: it is an int to Python, never meant as one here)."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ValueError(f"{name} = {value!r} must be an integer")


def real(value, name):
    """value as a float: any real number but a bool."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise ValueError(f"{name} = {value!r} must be a number")


def boolean(value, name):
    """value as a bool: True or False (Python's or numpy's) only."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} = {value!r} must be True or False")


def token_ids(values, name):
    """A sequence of token ids as ints, each an integer; name[k] names a bad one."""
    return [integer(t, f"{name}[{k}]") for k, t in enumerate(values)]
