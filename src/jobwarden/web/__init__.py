"""`jobwarden web`: a dashboard and a JSON API over the same views the CLI prints (the `web` extra:
uvicorn and h11; imported by its command only).

Safe by default: it listens on 127.0.0.1, every request needs the token from JOBWARDEN_HOME/web.token
(printed in the URL; a browser then holds a session cookie), the Host header must be one of ours, and a
change of a job needs more still (`gate`). It never serves a job's environment. Nothing a client
without the token sends may hold the server: deadlines and a connection cap (`connections`).
"""
