"""`pipe predict --draw`: each image or PDF page drawn with its row's answer into DIR/draw/, as PaddleOCR's
visualisation draws an OCR result (`draw_ocr_box_txt`: the page with each line's polygon on the left, the texts
written at their places on a white page on the right) and as a detector's boxes are drawn:

- the OCR system: red polygons on the page, the texts (Noto Sans CJK, the font pipe's generated lines use) in
  their boxes on the right half;
- ocr_det: red polygons and their scores; detection: red boxes with label and score;
- classification, text models, ocr_rec and ocr_cls: nothing to draw (the CLI says so once; no draw/ folder).

A picture is named after its source's file name (and page) with a short hash of the source's path
(`name`), so files of one name in different folders do not overwrite each other. The image is read again from
its source (a PDF page rendered again at the run's dpi): the model's input may be resized, the picture is not.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

DRAWN = ("ocr_system", "ocr_det", "detection")
RED = (230, 30, 30)


def name(source: str, page: int | None) -> str:
    """The picture's file name for an item: `scan.pdf.p0003-1a2b3c.png`, `photo.jpg-1a2b3c.png`."""
    tag = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:6]
    return f"{os.path.basename(source)}{f'.p{page:04d}' if page else ''}-{tag}.png"


class Drawer:
    """Draws each written row of a batch (`rows`) into `folder`, atomically per picture."""

    def __init__(self, folder: Path, task: str, dpi: float, max_pixels: int):
        self.folder, self.task, self.dpi, self.max_pixels = Path(folder), task, dpi, max_pixels
        self.folder.mkdir(parents=True, exist_ok=True)
        self._font: dict[int, Any] = {}

    def rows(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            image = self._source(row)
            if image is None:
                continue
            picture = self.draw(image, row["answer"])
            path = self.folder / name(row["source"], row["page"])
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            picture.save(tmp, "PNG")
            os.replace(tmp, path)

    def _source(self, row: dict[str, Any]) -> Any:
        from PIL import Image

        from pipeline.predict import inputs

        try:
            if row["page"]:
                item = inputs.Item(row["source"], "page", page=row["page"])
                return Image.fromarray(inputs.render_page(item, self.dpi, self.max_pixels))
            with Image.open(row["source"]) as im:
                return im.convert("RGB")
        except (OSError, inputs.Unreadable):  # changed or gone since it was read: its row stands, no picture
            return None

    def draw(self, image: Any, answer: dict[str, Any]) -> Any:
        from PIL import Image, ImageDraw

        left = image.copy()
        pen = ImageDraw.Draw(left)
        width = max(2, round(min(image.size) / 300))
        if self.task == "detection":
            for d in answer["detections"][0]:
                x1, y1, x2, y2 = d["box"]
                pen.rectangle([x1, y1, x2, y2], outline=RED, width=width)
                pen.text((x1 + 2, y1 + 2), f"{d['label']} {d['score']:.2f}", fill=RED, font=self.font(12))
            return left
        if self.task == "ocr_det":
            for b in answer["boxes"][0]:
                pts = [tuple(p) for p in b["points"]]
                pen.polygon(pts, outline=RED, width=width)
                pen.text(pts[0], f"{b['score']:.2f}", fill=RED, font=self.font(12))
            return left
        lines = answer["pages"][0]
        right = Image.new("RGB", image.size, (255, 255, 255))
        ink = ImageDraw.Draw(right)
        for line in lines:
            pts = [tuple(p) for p in line["points"]]
            pen.polygon(pts, outline=RED, width=width)
            ink.polygon(pts, outline=(120, 120, 120), width=1)
            height = np.linalg.norm(np.subtract(pts[0], pts[3]))
            ink.text(pts[0], line["text"], fill=(0, 0, 0), font=self.font(max(8, int(height * 0.8))))
        out = Image.new("RGB", (image.width * 2, image.height), (255, 255, 255))
        out.paste(left, (0, 0))
        out.paste(right, (image.width, 0))
        return out

    def font(self, size: int) -> Any:
        """Noto Sans CJK at `size` px (a handful of sizes are cached: line heights are rounded to 4 px)."""
        from PIL import ImageFont

        from pipeline.tasks.ocr_rec.data import font_path

        size = max(8, min(200, size // 4 * 4))
        if size not in self._font:
            self._font[size] = ImageFont.truetype(str(font_path()), size)
        return self._font[size]
