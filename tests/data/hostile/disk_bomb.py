# Fills its folder with many files, each under the one-file limit, until the writes are refused.
import os

chunk = b"\0" * (1 << 20)
written = 0
for i in range(100_000):
    with open(f"part-{i:06d}.bin", "wb") as f:
        for _ in range(2):
            f.write(chunk)
            written += len(chunk)
print(written, "bytes written in", len(os.listdir(".")), "files")
