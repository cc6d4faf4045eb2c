"""Encoded image bytes: what kind of file they are."""


def sniff_ext(data: bytes) -> str:
    """The file suffix (with its dot) of encoded image bytes, by magic number; '.img' if unknown."""
    for magic, ext in ((b"\x89PNG", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"GIF8", ".gif"), (b"RIFF", ".webp"),
                       (b"BM", ".bmp")):
        if data.startswith(magic):
            return ext
    return ".img"
