"""Inventories as the tests write them, and the CLI run against one whose host is a loopback
listener that counts connection attempts: what shows that no SSH happened."""
import socket
import textwrap
import threading

from support.site import Sandbox

def write(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path


class Listener:
    """A loopback TCP listener that counts connection attempts: the 'no SSH happened' oracle."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def run_without_connecting(tmp_path, host_yaml: str, *args: str):
    """Run the CLI against an inventory whose host is a loopback listener that counts
    connection attempts: returns (result, attempts)."""
    listener = Listener()
    try:
        inv_dir = write(tmp_path / "inv", {"hosts.yml": host_yaml.format(port=listener.port)})
        res = Sandbox(None, tmp_path).inv(*args, inventory=inv_dir, timeout=60)
    finally:
        listener.close()
    return res, listener.accepted
