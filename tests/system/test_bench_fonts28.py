"""bench/fonts28.py: typeset digits framed as MNIST frames its own, for `train --public`."""

from __future__ import annotations

import numpy as np
import pytest

from bench import fonts28

FONTS = fonts28.font_files("/usr/share/fonts/**/*.ttf")


@pytest.mark.skipif(not FONTS, reason="no TrueType fonts on this machine")
def test_rendered_digits_are_framed_as_mnist_and_balanced() -> None:
    x, y = fonts28.make(40, FONTS, seed=3)
    assert x.shape == (40, 1, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y, minlength=10).tolist() == [4] * 10
    rows, cols = np.indices((28, 28))
    for image in x[:, 0].astype(np.float64):
        lit = np.argwhere(image > 0)
        extent = lit.max(axis=0) - lit.min(axis=0) + 1
        assert extent.max() <= fonts28.BOX  # the glyph fits MNIST's 20 × 20 box
        assert image[:3].sum() == 0 or image[-3:].sum() == 0  # a black margin
        centre = np.array([(rows * image).sum(), (cols * image).sum()]) / image.sum()
        assert np.abs(centre - 14).max() <= 2.0  # centre of mass near the middle
    again, _ = fonts28.make(40, FONTS, seed=3)
    assert np.array_equal(x, again)  # a public seed: the same set every time
