# Tries to create files outside its temp dir and prints where it managed to.
import json
import os

NAME = "PWNED_by_sandbox_test"
targets = ["/tmp", "/work", "/work/main", "/root", "/", "/usr", "/dev", "/dev/shm", "/proc", "..", "../..",
           os.path.expanduser("~/..")] + list(globals().get("EXTRA_TARGETS", []))
wrote = []
for folder in targets:
    try:
        with open(os.path.join(folder, NAME), "w") as f:
            f.write("pwned")
        wrote.append(folder)
    except OSError:
        pass
print(json.dumps({"wrote": wrote, "cwd": os.getcwd()}))
