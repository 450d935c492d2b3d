FROM python:3.11-slim
# The service needs no privilege: it runs as this user, never as root.
RUN useradd --system --uid 10001 --home-dir /var/lib/idpool --create-home \
        --shell /usr/sbin/nologin idpool
WORKDIR /app
COPY constraints.txt pyproject.toml README.md ./
COPY pool ./pool
COPY service ./service
COPY idpool ./idpool
# The node renders formatted IDs with the client's formats module (one module for both;
# the client's optional C module is skipped here, with no compiler: the node never uses it)
COPY client ./client
# -c constraints.txt: the versions the tests ran against (`make constraints`),
# never whatever is newest on the day the image is built.
# idpool declares idpool-client, which is on no index: pip takes it from ./client,
# named in the same command.
RUN pip install --no-cache-dir -c constraints.txt ./client .
USER idpool
# Writable by idpool: where `--embedded` keeps ./idpool.db.
WORKDIR /var/lib/idpool
ENTRYPOINT ["idpool"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
