"""The slow server as it runs now (`live=PID` or `live=URL`): measured without a restart.

sleuth restarts the server for every trial, so it can never see a cause that lives inside a
long-running process: what it accumulated over days (fragmentation, a leak, the gen-2 GC pauses
a transient overload leaves in SGLang, issue 30596). A live server is measured as it is, with
the same bench; with `live.restart=true` it is then stopped, the same command is started fresh
in the same environment and measured again, and at the end the original command is relaunched,
leaving the node as it was found. The difference between the running server and a fresh
restart of it is the cause class **server state**.

- `proc`     what /proc says of a process: command line, environment, working directory,
             start time, resident memory, its children, the ports it listens on, its log file
- `attach`   the running server (`LiveServer`): its process (from a PID or from the port a URL
             names), what it reports at `/server_info`, its uptime and memory
- `measure`  the bench against a running server, and a fresh start of its command, as trial
             results (a live server is one "restart" sleuth did not make)
- `restart`  stopping the server, and relaunching its original command detached
- `verdict`  the decision (pure): state shown, ruled out, or undecided, and its sentence
"""
