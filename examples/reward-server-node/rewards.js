// The reward functions of the example server, chosen by an item's data_source.
// Each returns a number, or throws when the item cannot be scored (the server
// then answers ok=false with the message, never a made-up 0).
'use strict';

// digits_reverse (rlfleet's built-in task): the first run of digits in the
// completion, compared position by position with the ground truth; partial
// credit is matches / max(len(answer), len(truth)).
function digitsReverse(item) {
  const truth = String(item.ground_truth).replace(/[^0-9]/g, '');
  const match = /[0-9]+/.exec(item.response);
  if (!match || !truth) return 0.0;
  const answer = match[0];
  let same = 0;
  for (let i = 0; i < Math.min(answer.length, truth.length); i += 1) {
    if (answer[i] === truth[i]) same += 1;
  }
  return same / Math.max(answer.length, truth.length);
}

// GSM8K: the number after the last "####", else the last number in the text,
// compared by value with the ground truth (commas and "$" ignored).
function finalNumber(text) {
  const clean = String(text).replace(/[$,]/g, '');
  const tail = clean.includes('####') ? clean.slice(clean.lastIndexOf('####') + 4) : clean;
  const numbers = tail.match(/-?[0-9]+(?:\.[0-9]+)?/g);
  if (!numbers) return null;
  return Number(clean.includes('####') ? numbers[0] : numbers[numbers.length - 1]);
}

function gsm8k(item) {
  const truth = finalNumber(item.ground_truth);
  if (truth === null) throw new Error(`ground truth ${JSON.stringify(item.ground_truth)} holds no number`);
  const answer = finalNumber(item.response);
  return answer !== null && Math.abs(answer - truth) < 1e-9 ? 1.0 : 0.0;
}

const BY_DATA_SOURCE = {
  digits_reverse: digitsReverse,
  'openai/gsm8k': gsm8k,
  gsm8k,
};

function scoreItem(item) {
  const fn = BY_DATA_SOURCE[item.data_source];
  if (!fn) {
    throw new Error(`no reward for data_source ${JSON.stringify(item.data_source)}; ` +
                    `this server knows ${Object.keys(BY_DATA_SOURCE).join(', ')}`);
  }
  return fn(item);
}

module.exports = { scoreItem, digitsReverse, gsm8k };
