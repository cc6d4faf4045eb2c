# Signals its parent and then every process it may signal. Run it ONLY inside a pid namespace.
import os
import signal

for what, target in (("parent", os.getppid()), ("all", -1)):
    try:
        os.kill(target, signal.SIGKILL)
        print(what, "signalled")
    except OSError as exc:
        print(what, type(exc).__name__)
print("still alive")
