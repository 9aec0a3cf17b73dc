// The demo page: one question box on EdgeQAClient, the answer streaming in, the tier and latency,
// and the recent lookups. The origin serves this page and /config.json (where the CDN, the edge
// and the origin are).
import { EdgeQAClient, InvalidQueryError } from "./edgeqa.js";

const $ = (id) => document.getElementById(id);
const config = await (await fetch("/config.json")).json();
const client = new EdgeQAClient({ ...config, origin: config.origin || window.location.origin });
const recent = [];

function render() {
  const rows = recent.slice(0, 10).map((r) => {
    const tr = document.createElement("tr");
    for (const value of [r.question, r.tier, r.ttfbMs.toFixed(1), r.totalMs.toFixed(1)]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    tr.dataset.tier = r.tier;
    return tr;
  });
  $("recent").tBodies[0].replaceChildren(...rows);
}

// Why the CDN's release pointer was refused, when it was: answers then come from the edge and
// the origin (a stale pointer costs latency, never a wrong answer).
const POINTER_PROBLEMS = {
  rollback: "is older than one this browser already saw (someone put back an old release)",
  stale: "has expired (no release was published or renewed in time)",
  unsigned: "is not signed by a trusted key",
};

function showPointerProblem(profile) {
  const problem = client.pointerProblems.get(profile) ?? "";
  $("pointer").dataset.problem = problem;
  $("pointer").hidden = !problem;
  $("pointer").textContent = problem
    ? `The CDN's release pointer ${POINTER_PROBLEMS[problem]}: answering from the edge and the origin.`
    : "";
}

$("ask").addEventListener("submit", async (event) => {
  event.preventDefault();
  const question = $("question").value;
  $("answer").textContent = "";
  $("error").textContent = "";
  $("tier").textContent = "…";
  $("tier").dataset.tier = "";
  $("latency").textContent = "";
  $("submit").disabled = true;
  try {
    const result = await client.ask(question, {
      onText: (text) => { $("answer").textContent += text; } });
    $("tier").textContent = `${result.tier} (${result.source})`;
    $("tier").dataset.tier = result.tier;
    $("latency").textContent =
      `first byte ${result.ttfbMs.toFixed(1)} ms · total ${result.totalMs.toFixed(1)} ms`;
    recent.unshift({ question, ...result });
    render();
  } catch (error) {
    $("tier").textContent = "";
    $("error").textContent = error instanceof InvalidQueryError
      ? `Please check the question: ${error.message}` : error.message;
  } finally {
    showPointerProblem(client.profileFor(question));
    $("submit").disabled = false;
    document.body.dataset.state = "done";
  }
});
document.body.dataset.state = "ready";
