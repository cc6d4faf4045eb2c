# Writes one file in its cwd until RLIMIT_FSIZE refuses.
chunk = b"\0" * (1 << 20)
with open("big.bin", "wb") as f:
    while True:
        f.write(chunk)
