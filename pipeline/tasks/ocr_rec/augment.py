"""Augmentation of a recognizer's training lines, as PaddleOCR's `RecAug` does it, kept mild: every line stays
readable. `augment(image, rng)` takes an RGB uint8 [H, W, 3] line of any size and returns another (the caller
resizes it to height 48 afterwards, `lines.prepare`); its only randomness is `rng`, so the same generator
state gives the same bytes.

Upstream is PaddleOCR's `ppocr/data/imaug/rec_img_aug.py` (`RecAug`, `BaseDataAugmentation`: each kind with
probability 0.4, the defaults: `configs/rec/PP-OCRv4/ch_PP-OCRv4_rec.yml` lists `RecAug` with no arguments).
Each kind here, in this order, with probability 0.4 (`PROB`), and where its range comes from:

- margins cropped (`crop_margins`, `crop_box`; upstream `get_crop`, crop_prob 0.4: 1-8 px off the top or the
  bottom, blind to the text, so it can cut ink): here each side loses a uniform share of its margin outside
  the ink's bounding box (`ink_box`, estimated from the image, padded by 2 px), never ink. First, on the line
  as given, where the ink is easiest to find;
- small rotation and perspective (`warp`; upstream TIA, tia_prob 0.4: `tia_perspective` moves each corner
  vertically by up to half the height, `tia_distort`/`tia_stretch` bend the line by moving points up to a
  third of a segment; `Config.make` draws a rotation of up to 10 degrees that `warp` never applies): here one
  homography, each corner moved vertically by up to a tenth of the height (a fifth of tia_perspective's) and
  a rotation of up to 2 degrees, less on a long line (its ends move by at most a fifth of the height), on a
  canvas grown to hold every corner, the new area filled with the line's background colour;
- Gaussian blur (`blur`; upstream blur_prob 0.4: cv2.GaussianBlur 5x5, sigma 1 at the line's own size): here
  sigma 0.5-1.2 px as seen at height 48 (scaled to the line's height), so a large scan and a small crop blur
  alike after the resize;
- colour jitter (`jitter_colour`; upstream hsv_aug_prob 0.4 scales HSV's V by 1 +- 0.001, which changes
  nothing visible, and its `jitter` is a 0-1% shift-and-smear, not colour; ABINetRecAug's CVColorJitter
  in the same file: brightness, contrast and saturation 0.5, hue 0.1): here half of ABINet's, brightness,
  contrast (about the mean) and saturation each times 0.75-1.25, hue turned by up to 0.05 of the circle;
- Gaussian noise (`add_noise`; upstream noise_prob 0.4 adds 0.5 x N(0, 0.1): a standard deviation of 0.16
  grey levels, invisible): here 2-8 grey levels, as `data.render`'s lines carry up to 6.

Left out of upstream's set: reverse (255 - image, reverse_prob 0.4): PP-OCRv4 was trained with it and reads
light-on-dark lines as well as dark ones (96.5% both on 200 short lines of `data.render`'s look); a caller
who wants to keep that in the fine-tune inverts a share of lines itself. Lines below 8 px in height or width
are only blurred, jittered and noised (nothing to crop, nothing to tilt).
"""

from __future__ import annotations

import math

import numpy as np

PROB = 0.4  # each kind's probability: RecAug's and BaseDataAugmentation's defaults
_PAD = 2  # px kept around the estimated ink box
_MIN_SIDE = 8  # below this, no crop and no warp


def augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An RGB uint8 [H, W, 3] line -> RGB uint8 [H', W', 3], each kind applied with probability `PROB`."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(f"augment takes an RGB uint8 [H, W, 3] line, got {image.dtype} {list(image.shape)}")
    crop, tilt, soften, colour, noise = rng.random(5) < PROB  # drawn first, always: one decision per kind
    out = np.ascontiguousarray(image)
    small = min(out.shape[:2]) < _MIN_SIDE
    if crop and not small:
        out = crop_margins(out, rng)
    if tilt and not small:
        out = warp(out, rng)
    if soften:
        out = blur(out, rng)
    if colour:
        out = jitter_colour(out, rng)
    if noise:
        out = add_noise(out, rng)
    return out


def background(image: np.ndarray) -> np.ndarray:
    """The paper's colour: the per-channel median of the outermost pixels (a line's margins are mostly
    paper, even where ink touches the edge)."""
    edge = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]]).astype(np.float32)
    return np.median(edge, axis=0)


def ink_box(image: np.ndarray) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right), bottom and right exclusive, of the pixels that differ from the background
    by more than the paper's noise can (4 robust standard deviations of the border + 8 grey levels) and by at
    least 30% of the strongest difference; None if there is no such pixel (a blank line)."""
    grey = image.astype(np.float32).mean(axis=2)
    edge = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
    bg = float(np.median(edge))
    sigma = 1.4826 * float(np.median(np.abs(edge - bg)))
    diff = np.abs(grey - bg)
    ink = diff > max(4 * sigma + 8, 0.3 * float(diff.max()))
    if not ink.any():
        return None
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def crop_margins(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The line inside `crop_box`."""
    t, b, l, r = crop_box(image, rng)
    return np.ascontiguousarray(image[t:b, l:r])


def crop_box(image: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) to keep, bottom and right exclusive: each side cut by a uniform share of
    its margin outside the ink box (padded by 2 px); the whole line if it is blank."""
    h, w = image.shape[:2]
    box = ink_box(image)
    if box is None:
        return 0, h, 0, w
    top, bottom = max(0, box[0] - _PAD), min(h, box[1] + _PAD)
    left, right = max(0, box[2] - _PAD), min(w, box[3] + _PAD)
    share = rng.random(4)
    return (int(share[0] * top), h - int(share[1] * (h - bottom)),
            int(share[2] * left), w - int(share[3] * (w - right)))


def warp(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A small rotation and perspective: corners moved vertically by up to h/10, then turned by up to 2
    degrees (at most atan(h / 5w), so a long line's ends move by no more than h/5), on a canvas that holds
    the whole result, filled with the background colour."""
    import cv2

    h, w = image.shape[:2]
    src = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    shift = rng.uniform(0, 0.1 * h, 4) * np.array([1, 1, -1, -1])  # top corners down, bottom ones up
    limit = min(2.0, math.degrees(math.atan(h / (5 * w))))
    angle = math.radians(float(rng.uniform(-limit, limit)))
    c, s = math.cos(angle), math.sin(angle)
    moved = src + np.stack([np.zeros(4), shift], axis=1)
    centre = np.float32([w / 2, h / 2])
    dst = (moved - centre) @ np.float32([[c, s], [-s, c]]) + centre
    lo = np.floor(dst.min(axis=0))
    size = np.ceil(dst.max(axis=0) - lo).astype(int)
    m = cv2.getPerspectiveTransform(src, (dst - lo).astype(np.float32))
    fill = tuple(float(v) for v in background(image))
    return cv2.warpPerspective(image, m, (int(size[0]), int(size[1])), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=fill)


def blur(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur of sigma 0.5-1.2 px at height 48, scaled to the line's height."""
    import cv2

    sigma = float(rng.uniform(0.5, 1.2)) * image.shape[0] / 48
    return cv2.GaussianBlur(image, (0, 0), sigmaX=sigma, sigmaY=sigma)


def jitter_colour(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness, contrast (about the mean) and saturation each times 0.75-1.25, then hue turned by up to
    0.05 of the circle."""
    import cv2

    bright, contrast, sat = rng.uniform(0.75, 1.25, 3)
    hue = float(rng.uniform(-0.05, 0.05))
    a = image.astype(np.float32) * bright
    a = (a - a.mean()) * contrast + a.mean()
    grey = a @ np.float32([0.299, 0.587, 0.114])
    a = grey[..., None] + (a - grey[..., None]) * sat
    hsv = cv2.cvtColor(np.clip(a, 0, 255).astype(np.uint8), cv2.COLOR_RGB2HSV)  # 8-bit hue: 0-179
    hsv[..., 0] = ((hsv[..., 0].astype(np.int32) + round(hue * 180)) % 180).astype(np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def add_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise of 2-8 grey levels, per pixel and channel."""
    a = image.astype(np.float32) + rng.normal(0, float(rng.uniform(2, 8)), image.shape).astype(np.float32)
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)
