FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY dispatcher ./dispatcher
COPY agent_worker ./agent_worker
COPY dlq_tools ./dlq_tools
COPY reach_cli ./reach_cli
COPY gateway ./gateway
COPY config ./config
RUN pip install --no-cache-dir '.[a2a,mcp]'
ENV REACH_CONFIG=/app/config/reach.toml
CMD ["reach", "--help"]
