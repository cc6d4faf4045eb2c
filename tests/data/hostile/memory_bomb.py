# Allocates 10 MB blocks until the address-space limit (RLIMIT_AS) refuses one.
blocks = []
while True:
    blocks.append(bytearray(10_000_000))
