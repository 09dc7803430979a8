"""The suite's warning policy (pyproject's ``filterwarnings``): a DeprecationWarning or FutureWarning
attributed to our own code is an error, one from a third-party module's internals is not."""

import warnings

import pytest


@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_deprecation_from_our_code_fails(category):
    with pytest.raises(category):
        warnings.warn_explicit("old api", category, "jaxformer/ops/x.py", 1,
                               module="jaxformer.ops.x")


def test_deprecation_inside_a_dependency_is_not_an_error():
    warnings.warn_explicit("old api", DeprecationWarning, "somelib/x.py", 1, module="somelib.x")
