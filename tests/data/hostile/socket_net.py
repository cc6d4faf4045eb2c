# Tries loopback and external connections, and a bind; prints what worked.
import json
import socket

ports = [22, 80, 443, 5000, 8000, 8080] + list(globals().get("EXTRA_PORTS", []))
report = {"connected": [], "errors": {}}
for host, port in [("127.0.0.1", p) for p in ports] + [("1.1.1.1", 53), ("8.8.8.8", 443), ("93.184.216.34", 80)]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect((host, port))
        report["connected"].append(f"{host}:{port}")
    except OSError as exc:
        report["errors"][f"{host}:{port}"] = type(exc).__name__
    finally:
        s.close()
try:
    socket.getaddrinfo("example.com", 80)
    report["dns"] = True
except OSError:
    report["dns"] = False
try:
    s = socket.socket()
    s.bind(("0.0.0.0", 8765))
    s.listen()
    report["bound"] = True  # only inside its own network namespace
except OSError as exc:
    report["bound"] = type(exc).__name__
print(json.dumps(report))
