# Tries to read files and folders outside its temp dir and prints what it could.
import json
import os

paths = ["/work/main/params.yaml", "/work/main", "/work", "/root", "/root/.ssh", "/root/.bash_history",
         "/home", "/etc/passwd", "/etc/shadow", "/etc/hostname", "/proc/1/environ", "/proc/1/cmdline",
         "/proc/self/environ", "/sys/fs/cgroup", "/tmp", "/var", "..", "../..", "/"]
report = {}
for path in paths:
    try:
        if os.path.isdir(path):
            report[path] = {"list": sorted(os.listdir(path))}
        else:
            with open(path, "rb") as f:
                report[path] = {"read": f.read(200).decode("utf-8", "replace")}
    except OSError as exc:
        report[path] = {"denied": type(exc).__name__}
print(json.dumps(report))
