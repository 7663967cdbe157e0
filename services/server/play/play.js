// The play page (docs/server.md, "Playground"): reset, act and watch one episode through the env
// server's own HTTP API (/info, /reset, /step, DELETE /sessions/{id}), with the typed token if any.
// The episode is a transcript: every observation (text and images) in turn order, under the action
// that led to it, the current one scrolled to the top of the view, below the sticky controls.
"use strict";
const ARROWS = { ArrowUp: "Up", ArrowDown: "Down", ArrowLeft: "Left", ArrowRight: "Right" };
const state = { session: null, done: false, turn: 0, total: 0, splits: [] };

// One API call: JSON in and out; an error answer throws "code: message".
async function call(method, path, body) {
  const headers = { "content-type": "application/json" };
  const token = $("token").value.trim();
  if (token) headers.authorization = `Bearer ${token}`;
  const init = { method, headers, body: body === undefined ? undefined : JSON.stringify(body) };
  const answer = await fetch(new URL(path, document.baseURI), init);
  if (answer.status === 204) return null;
  const data = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    const error = data.error || { code: String(answer.status), message: answer.statusText };
    throw new Error(`${error.code}: ${error.message}`);
  }
  return data;
}

async function connect() {
  sessionStorage.setItem("vistarl-token", $("token").value);
  const info = await call("GET", "info");
  document.title = `${info.name}: vistarl playground`;
  $("env-name").textContent = info.name;
  $("env-version").textContent = `v${info.version}`;
  $("env-description").textContent = info.description;
  $("action-format").textContent = `Action format: ${info.action_format}`;
  state.splits = info.datasets.splits;
  $("split").replaceChildren(new Option("(none)", ""), ...state.splits.map((s) => new Option(s.name, s.name)));
  showSplitSize();
  $("tools").replaceChildren(...info.tools.map(toolControls));
  setPlaying(false);
}

function showSplitSize() {
  const split = state.splits.find((s) => s.name === $("split").value);
  $("split-size").textContent = split ? `rows 0 to ${split.size - 1}` : "";
}

// The reset body: a seed, or a task id SPLIT/INDEX, and the options typed as JSON.
function resetBody() {
  const body = {};
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  else if ($("split").value) body.task_id = `${$("split").value}/${$("row").value || 0}`;
  const options = $("options").value.trim();
  if (options) body.options = JSON.parse(options);
  return body;
}

async function reset() {
  const body = resetBody();
  await endSession();
  const answer = await call("POST", "reset", body);
  Object.assign(state, { session: answer.session_id, done: false, turn: 0, total: 0 });
  $("session").textContent = answer.session_id;
  $("transcript").replaceChildren();
  showTurn(answer, "reset", 0, false);
  setPlaying(true);
}

// Step with the response text, or with a call of one of the env's tools.
async function act(step) {
  if (!state.session || state.done) return;
  const answer = await call("POST", "step", { session_id: state.session, ...step });
  state.turn += 1;
  state.total += answer.reward;
  state.done = answer.done;
  const label = step.action !== undefined ? step.action : `${step.tool_call.name} ${JSON.stringify(step.tool_call.arguments)}`;
  showTurn(answer, label, answer.reward, answer.done);
  setPlaying(!answer.done);
}

async function endSession() {
  if (!state.session) return;
  const session = state.session;
  state.session = null;
  setPlaying(false);
  await call("DELETE", `sessions/${encodeURIComponent(session)}`).catch(() => null);
}

// Show a reset's or a step's answer: its observation appended to the transcript (under the action that
// led to it) and brought into view, the rewards, done and the env's info.
function showTurn({ observation, info }, label, reward, done) {
  const entry = Object.assign(document.createElement("div"), { className: "message turn" });
  entry.dataset.turn = state.turn;
  const head = `turn ${state.turn}: ${label}` + (state.turn ? ` (reward ${Number(reward.toFixed(4))}${done ? ", done" : ""})` : "");
  const images = Object.assign(document.createElement("div"), { className: "images" });
  images.append(...observation.images.map((url) => Object.assign(document.createElement("img"), { src: url, alt: `turn ${state.turn}` })));
  entry.append(
    Object.assign(document.createElement("div"), { className: "role", textContent: head }),
    images,
    Object.assign(document.createElement("pre"), { className: "text", textContent: observation.text }),
  );
  $("transcript").append(entry);
  $("turn").textContent = state.turn;
  $("reward").textContent = Number(reward.toFixed(4));
  $("total").textContent = Number(state.total.toFixed(4));
  $("done").hidden = !done;
  $("info").textContent = JSON.stringify(info, null, 1);
  bringIntoView(entry);
}

// Scroll so that `entry` starts just below the sticky controls, once its images have their size (unless a
// later turn came meanwhile); as the last entry it is made tall enough to be scrolled there.
async function bringIntoView(entry) {
  await Promise.all([...entry.querySelectorAll("img")].map((img) => img.decode().catch(() => null)));
  if (entry !== $("transcript").lastElementChild) return;
  const below = $("controls").offsetHeight;
  for (const earlier of $("transcript").children) earlier.style.minHeight = "";
  entry.style.minHeight = `${window.innerHeight - below}px`;
  window.scrollTo({ top: entry.getBoundingClientRect().top + window.scrollY - below, behavior: "instant" });
}

function setPlaying(playing) {
  for (const control of document.querySelectorAll("#tools button, #send")) control.disabled = !playing;
  $("end").disabled = !state.session;
}

// Controls for one tool: a button per value of a single list-of-choices parameter (Sokoban's moves,
// one per turn), one button for a tool without parameters, else a field per parameter and a button.
function toolControls(tool) {
  const fn = tool.function;
  const properties = (fn.parameters && fn.parameters.properties) || {};
  const names = Object.keys(properties);
  const box = Object.assign(document.createElement("span"), { className: "tool", title: fn.description || "" });
  const button = (label, argumentsOf) => {
    const control = Object.assign(document.createElement("button"), { textContent: label, disabled: true });
    control.dataset.tool = fn.name;
    control.dataset.value = label;
    control.onclick = () => guarded(() => act({ tool_call: { name: fn.name, arguments: argumentsOf() } }));
    return control;
  };
  const only = properties[names[0]];
  if (names.length === 1 && only.type === "array" && only.items && only.items.enum) {
    box.append(...only.items.enum.map((value) => button(value, () => ({ [names[0]]: [value] }))));
    return box;
  }
  const fields = names.map((name) => {
    const kind = properties[name].type === "number" || properties[name].type === "integer" ? "number" : "text";
    return Object.assign(document.createElement("input"), { placeholder: name, type: kind, size: 10 });
  });
  const argumentsOf = () =>
    Object.fromEntries(names.map((name, i) => [name, fields[i].type === "number" ? Number(fields[i].value) : fields[i].value]));
  box.append(...fields, button(fn.name, argumentsOf));
  return box;
}

// Arrow keys press the tool button of that direction, when there is one and no field has the focus.
function onKey(event) {
  const direction = ARROWS[event.key];
  if (!direction || ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName)) return;
  const control = document.querySelector(`#tools button[data-value="${direction}"]`);
  if (control && !control.disabled) {
    event.preventDefault();
    control.click();
  }
}

$("token").value = sessionStorage.getItem("vistarl-token") || "";
$("connect").onclick = () => guarded(connect);
$("reset").onclick = () => guarded(reset);
$("end").onclick = () => guarded(endSession);
$("send").onclick = () => guarded(() => act({ action: $("action").value }));
$("split").onchange = showSplitSize;
document.addEventListener("keydown", onKey);
guarded(connect);
