# Never finishes, without using CPU: only the wall-clock timeout ends it.
import time

while True:
    time.sleep(0.05)
