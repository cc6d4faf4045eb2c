# Spawns a shell two ways and prints what it saw.
import os
import subprocess

res = subprocess.run(["/bin/sh", "-c", "id; ls /; cat /etc/passwd; ls /work /root/.ssh"], capture_output=True,
                     text=True)
print("subprocess:", res.returncode, res.stdout.strip().replace("\n", " | "), res.stderr.strip()[-200:])
print("os.system:", os.system("echo system-ran; cat /work/main/params.yaml > /dev/null"))
