// A small HTTP agent in Node.js (no dependencies) that Reach serves through
//   reach-worker --capability words --http http://127.0.0.1:9001/process --http-ready auto \
//                --http-callback-url http://127.0.0.1:8080
//
// It counts the words of {"text": "..."} and shows each way an HTTP agent may answer:
//   {"text": ...}                      JSON at once: {"status": "success", "result": {...}}
//   {"text": ..., "mode": "progress"}  NDJSON: progress lines, then the outcome line
//   {"text": ..., "mode": "accept"}    202 {"accepted": true, "status_url": ...}; the outcome is
//                                      posted to X-Reach-Callback-Url later (or read by polling)
//   {"text": ..., "mode": "poll"}      202 without calling back: Reach polls status_url
//   {"sleep_ms": 1000}                 works for a second, then answers
//   {} (no text)                       {"status": "invalid_request", ...}
//   {"text": ..., "mode": "busy"}      503 with Retry-After: 1 on the first attempt (Reach retries)
//   {"text": ..., "mode": "headers"}   the Reach headers it got, as its result (tests)
// GET /ready answers 200 while ready (POST /admin/ready {"ready": false} turns it off: tests).
// PORT=0 (the default) takes a free port; the first line printed is the URL it listens on.
"use strict";
const http = require("http");

const jobs = new Map(); // task id -> {done, outcome, progress}: tasks accepted with 202
const accepted = []; // what each accepted request carried (tests post stale callbacks with it)
let ready = true;

function send(res, code, body, type = "application/json") {
  res.writeHead(code, { "Content-Type": type });
  res.end(typeof body === "string" ? body : JSON.stringify(body));
}

function readJson(req) {
  return new Promise((resolve, reject) => {
    let text = "";
    req.setEncoding("utf8");
    req.on("data", (chunk) => { text += chunk; });
    req.on("end", () => { try { resolve(JSON.parse(text || "null")); } catch (e) { reject(e); } });
    req.on("error", reject);
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function count(text) {
  const words = text.split(/\s+/).filter(Boolean);
  return { words: words.length, longest: words.reduce((a, w) => (w.length > a.length ? w : a), "") };
}

async function callBack(url, token, outcome) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Reach-Callback-Token": token },
    body: JSON.stringify(outcome),
  });
  return res.status;
}

async function progress(res, payload) {
  res.writeHead(200, { "Content-Type": "application/x-ndjson" });
  const steps = payload.steps || 3;
  for (let i = 1; i <= steps; i++) {
    await sleep(payload.step_ms || 50);
    res.write(JSON.stringify({ progress: i / (steps + 1), message: `step ${i} of ${steps}` }) + "\n");
  }
  res.end(JSON.stringify({ status: "success", result: count(payload.text) }) + "\n");
}

function accept(req, res, task, payload) {
  const base = `http://${req.headers.host}`;
  const job = { done: false, outcome: null, progress: 0.1 };
  jobs.set(task.task_id, job);
  const url = req.headers["x-reach-callback-url"];
  const token = req.headers["x-reach-callback-token"];
  accepted.push({ task_id: task.task_id, attempt: task.attempt, callback_url: url || null, token: token || null });
  send(res, 202, { accepted: true, status_url: `${base}/status/${encodeURIComponent(task.task_id)}` });
  setTimeout(async () => {
    job.outcome = { status: "success", result: count(payload.text) };
    job.done = true;
    // ("callback": "never": only polling finds the outcome, as when a callback is lost)
    if (payload.mode === "accept" && payload.callback !== "never" && url && token) {
      try { await callBack(url, token, job.outcome); } catch (e) { console.error(`callback failed: ${e}`); }
    }
  }, payload.work_ms || 100);
}

async function handleTask(req, res) {
  const task = await readJson(req);
  const payload = (task && task.payload) || {};
  if (payload.sleep_ms) await sleep(payload.sleep_ms);
  if (typeof payload.text !== "string") {
    return send(res, 200, { status: "invalid_request", error: "payload.text must be a string" });
  }
  if (payload.mode === "busy" && task.attempt < 2) {
    res.writeHead(503, { "Content-Type": "text/plain", "Retry-After": "1" });
    return res.end("busy: try again in a second");
  }
  if (payload.mode === "headers") {
    const seen = Object.fromEntries(Object.entries(req.headers).filter(([k]) => k.startsWith("x-reach-") || k === "authorization"));
    return send(res, 200, { status: "success", result: seen });
  }
  if (payload.mode === "progress") return progress(res, payload);
  if (payload.mode === "accept" || payload.mode === "poll") return accept(req, res, task, payload);
  send(res, 200, { status: "success", result: count(payload.text) });
}

function status(res, taskId) {
  const job = jobs.get(taskId);
  if (!job) return send(res, 404, { status: "invalid_request", error: "no such job" });
  if (!job.done) return send(res, 202, { progress: job.progress, message: "working" });
  send(res, 200, job.outcome);
}

const server = http.createServer(async (req, res) => {
  try {
    const path = new URL(req.url, "http://x").pathname;
    if (req.method === "POST" && path === "/process") return await handleTask(req, res);
    if (req.method === "GET" && path.startsWith("/status/")) return status(res, decodeURIComponent(path.slice(8)));
    if (req.method === "GET" && path === "/ready") return send(res, ready ? 200 : 503, { ready });
    if (req.method === "POST" && path === "/admin/ready") { ready = !!(await readJson(req)).ready; return send(res, 200, { ready }); }
    if (req.method === "GET" && path === "/admin/accepted") return send(res, 200, accepted);
    send(res, 404, { error: "not found" });
  } catch (e) {
    send(res, 500, { status: "failure", error: String(e) });
  }
});
server.keepAliveTimeout = 60000;
server.listen(Number(process.env.PORT || 0), "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
