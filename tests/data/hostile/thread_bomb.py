# Starts sleeping threads until the process cap refuses one.
import threading
import time

while True:
    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
