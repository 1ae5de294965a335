"""tidemark-gui opens a real window under Xvfb and renders it (a screenshot with content)."""
import os
import struct
import subprocess
import tempfile
import unittest
import zlib

from tidemark_env import BIN


def png_pixels(path):
    """(width, height, set of distinct pixels) of an 8-bit RGB/RGBA, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels = set()
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, bpp):
            pixels.add(bytes(line[x:x + bpp]))
        prev = line
    return width, height, pixels


class GuiWindowTest(unittest.TestCase):
    def test_window_renders_under_xvfb(self):
        out = os.path.join(tempfile.mkdtemp(prefix="tidemark-gui-"), "window.png")
        r = subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1280x800x24",
                            os.path.join(BIN, "tidemark-gui"), "--screenshot", out],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        width, height, pixels = png_pixels(out)
        self.assertEqual((width, height), (960, 600))
        # A background and anti-aliased text: many colours, not a blank window.
        self.assertGreater(len(pixels), 8)


if __name__ == "__main__":
    unittest.main()
