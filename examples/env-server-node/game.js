// The environment itself: a digit-reversal game with retries, and a calculator tool.
// Replace these three functions with yours; server.js does the contract.
'use strict';

const MAX_TRIES = 3;

// A new episode's state, from its data row (throws if the row cannot start one).
function start(row) {
  if (!/^\d+$/.test(row.ground_truth)) {
    throw new Error(`ground_truth ${JSON.stringify(row.ground_truth)} is not a digit string`);
  }
  return { answer: row.ground_truth, tries: 0 };
}

function credit(attempt, answer) {
  const digits = attempt.replace(/\D/g, '');
  const width = Math.max(digits.length, answer.length);
  let right = 0;
  for (let i = 0; i < Math.min(digits.length, answer.length); i++) right += digits[i] === answer[i] ? 1 : 0;
  return width ? right / width : 0;
}

function calculator(expression) {
  if (!/^[\d\s+\-*/().]+$/.test(expression)) throw new Error(`not arithmetic: ${expression}`);
  const value = Function(`"use strict"; return (${expression});`)(); // digits and operators only
  if (!Number.isFinite(value)) throw new Error('no finite result');
  return value;
}

// The model's turn -> { observation: {messages, text}, reward (optional), done, tool_errors }.
function step(state, action) {
  if (action.tool_calls.length > 0) { // tool calls: answer each in a "tool" message, no try used
    let toolErrors = 0;
    const messages = action.tool_calls.map((call) => {
      const args = call.arguments_json ? JSON.parse(call.arguments_json) : {}; // empty: no arguments
      const expression = typeof args === 'string' ? args : String(args.expression || '');
      try {
        if (call.name !== 'calculator') throw new Error(`unknown tool ${call.name}`);
        return { role: 'tool', content: String(calculator(expression)), name: 'calculator' };
      } catch (err) {
        toolErrors += 1;
        return { role: 'tool', content: `error: ${err.message}`, name: 'calculator' };
      }
    });
    return { observation: { messages, text: '' }, done: false, tool_errors: toolErrors };
  }
  state.tries += 1;
  const attempt = action.text.trim();
  if (attempt === state.answer || state.tries >= MAX_TRIES) {
    return { observation: { messages: [], text: '' }, reward: credit(attempt, state.answer) - 0.25 * (state.tries - 1),
             done: true, tool_errors: 0 };
  }
  const request = `Reverse the digits: ${state.answer.split('').reverse().join('')}`;
  return { observation: { messages: [{ role: 'user', content: request, name: '' }], text: '' }, done: false,
           tool_errors: 0 };
}

// An episode the rollout stopped before done: its reward, or null for none.
function end(state, reason) {
  return null;
}

const description = {
  name: 'digits_game_node',
  description: 'Reverse a digit string in up to 3 tries; a calculator tool is at hand.',
  tools: [{ name: 'calculator', description: 'Evaluates an arithmetic expression.',
            parameters_json: JSON.stringify({ type: 'object', properties: { expression: { type: 'string' } } }) }],
};

module.exports = { start, step, end, description };
