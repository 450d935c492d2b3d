FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pool ./pool
COPY service ./service
COPY idpool ./idpool
# The node renders formatted IDs with the client's formats module (one module for both)
COPY client ./client
RUN pip install --no-cache-dir ./client .
ENTRYPOINT ["idpool"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
