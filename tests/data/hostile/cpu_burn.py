# Tight arithmetic forever: RLIMIT_CPU ends it (SIGXCPU) before the wall clock when cpu_s < timeout_s.
x = 0
while True:
    x = (x * 31 + 7) % 1000003
