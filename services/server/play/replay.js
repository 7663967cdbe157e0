// The replay page (docs/server.md, "Playground"): step through the turns of trajectory files, in the
// browser. A trajectory is the JSON of trainer/rollout/trajectory.py: its messages hold {"type": "image"}
// parts whose k-th one is images[k], and turn k is the observation before the k-th assistant reply,
// the reply, turn_rewards[k], and the tokens whose turn_index is k (loss_mask 1 marks generated ones).
"use strict";
const view = { trajectories: [], trajectory: null, turns: [], turn: 0 };

// Read the chosen files: trajectories from .jsonl / .json, images by file name (for trajectory.json).
async function load(files) {
  const images = {};
  const trajectories = [];
  for (const file of files) {
    if (/\.(png|jpe?g|webp)$/i.test(file.name)) images[file.name] = URL.createObjectURL(file);
  }
  for (const file of files) {
    const text = await file.text();
    if (file.name.endsWith(".jsonl")) {
      text.split("\n").forEach((line, i) => line.trim() && trajectories.push(parse(line, `${file.name}:${i + 1}`)));
    } else if (file.name.endsWith(".json")) {
      trajectories.push(parse(text, file.name));
    }
  }
  for (const trajectory of trajectories) {
    trajectory.images = trajectory.images.map((image) => (image.startsWith("data:") ? image : images[image] || image));
  }
  if (!trajectories.length) throw new Error("no trajectory in the chosen files (.jsonl or .json)");
  view.trajectories = trajectories;
  $("trajectory").replaceChildren(
    ...trajectories.map((t, i) => new Option(`${t.episode_id}: ${t.status}, reward ${round(t.episode_reward)}`, i)),
  );
  show(0);
}

function parse(text, where) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`${where} is not JSON: ${error.message}`);
  }
}

// Group the messages into turns, numbering the image parts in order.
function turnsOf(trajectory) {
  const turns = [];
  let current = { context: [], reply: null };
  let image = 0;
  for (const message of trajectory.messages) {
    const parts = typeof message.content === "string" ? [{ type: "text", text: message.content }] : message.content;
    const shown = { role: message.role, parts: parts.map((p) => (p.type === "image" ? { image: image++ } : p)) };
    if (message.role === "assistant") {
      current.reply = shown;
      turns.push(current);
      current = { context: [], reply: null };
    } else {
      current.context.push(shown);
    }
  }
  if (current.context.length) turns.push(current);
  return turns;
}

function show(index) {
  const t = view.trajectories[index];
  view.trajectory = t;
  view.turns = turnsOf(t);
  $("trajectory").value = index;
  $("status").textContent = t.status;
  $("episode-reward").textContent = round(t.episode_reward);
  $("turns").textContent = view.turns.length;
  const generated = t.loss_mask.filter((bit) => bit === 1).length;
  $("tokens").textContent = `${t.train_ids.length} (${generated} generated)`;
  const details = { episode_id: t.episode_id, env: t.env, metrics: t.metrics, error: t.error };
  $("details").textContent = JSON.stringify(details, null, 1);
  $("summary").hidden = false;
  $("turn-view").hidden = false;
  showTurn(0);
}

function showTurn(k) {
  const t = view.trajectory;
  view.turn = Math.max(0, Math.min(k, view.turns.length - 1));
  const turn = view.turns[view.turn];
  $("turn").textContent = view.turn + 1;
  $("turn-count").textContent = view.turns.length;
  const reward = t.turn_rewards[view.turn];
  $("turn-reward").textContent = reward === undefined ? "none" : round(reward);
  let context = 0;
  let generated = 0;
  t.turn_index.forEach((turnOfToken, i) => {
    if (turnOfToken !== view.turn) return;
    if (t.loss_mask[i] === 1) generated += 1;
    else context += 1;
  });
  $("context-tokens").textContent = context;
  $("generated-tokens").textContent = generated;
  const messages = turn ? [...turn.context, ...(turn.reply ? [turn.reply] : [])] : [];
  $("messages").replaceChildren(...messages.map(messageView));
  $("prev").disabled = view.turn === 0;
  $("next").disabled = view.turn >= view.turns.length - 1;
}

function messageView(message) {
  const box = Object.assign(document.createElement("div"), { className: `message ${message.role}` });
  box.append(Object.assign(document.createElement("div"), { className: "role", textContent: message.role }));
  const images = Object.assign(document.createElement("div"), { className: "images" });
  for (const part of message.parts) {
    if (part.image !== undefined) {
      images.append(Object.assign(document.createElement("img"), { src: view.trajectory.images[part.image], alt: `image ${part.image}` }));
    } else if (part.text !== undefined) {
      box.append(Object.assign(document.createElement("pre"), { textContent: part.text }));
    }
  }
  if (images.childElementCount) box.insertBefore(images, box.children[1]);
  return box;
}

const round = (x) => Number(Number(x).toFixed(4));

$("files").onchange = (event) => guarded(() => load([...event.target.files]));
$("trajectory").onchange = () => show(Number($("trajectory").value));
$("prev").onclick = () => showTurn(view.turn - 1);
$("next").onclick = () => showTurn(view.turn + 1);
document.addEventListener("keydown", (event) => {
  if (view.trajectory && event.key === "ArrowLeft") showTurn(view.turn - 1);
  if (view.trajectory && event.key === "ArrowRight") showTurn(view.turn + 1);
});
