FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pool ./pool
COPY service ./service
COPY idpool ./idpool
RUN pip install --no-cache-dir .
ENTRYPOINT ["idpool"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
