"""What every run loop shares: the child process runner and guardian, the
loop plumbing (log lines, signals, transient errors), systemd notify."""
