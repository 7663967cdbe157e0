// What both playground pages use (services/server/play): element lookup, and running a page action
// with its error shown in the page's #error line instead of thrown.
"use strict";

const $ = (id) => document.getElementById(id);

async function guarded(work) {
  $("error").textContent = "";
  try {
    await work();
  } catch (error) {
    $("error").textContent = error.message;
  }
}
