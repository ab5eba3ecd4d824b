// Learning a learner can see: the task picker, the optimizer and learning-rate controls, the
// sample panel that follows the loss, and the glossary's popover by keyboard, click and tap.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  assertLinkReopens,
  close,
  formValues,
  hashOf,
  launch,
  location,
  openPage,
  openReady,
  setControl,
  settled,
  singleSteps,
  STEP_TIMEOUT_MS,
  URL_,
} from './helpers.js';

before(launch);
after(close);

/** The sample panel's lines, newest first: step, loss and text. */
const sampleLines = (page) => page.evaluate(() => [...document.querySelectorAll('[data-testid="sample-line"]')]
  .map((l) => ({ step: Number(l.dataset.step), loss: Number(l.dataset.loss), text: l.dataset.text })));

test('the sample changes as the loss falls', { timeout: 600_000 }, async () => {
  // The text task, with an lr that learns visibly in a dozen steps of the tiny model.
  const { context, page } = await openReady(hashOf({ task: 'text', lr: '0.01', dropout: '0' }));
  try {
    const sample = page.getByTestId('sample');
    assert.match(await sample.innerText(), /What the model writes[\s\S]*not trained yet/);
    await singleSteps(page, 1);
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="sample-line"]').length === 1, null, { timeout: 10_000 });
    const [first] = await sampleLines(page);
    assert.equal(first.step, 1);
    assert.ok(first.text.length >= 8, `the model wrote ${JSON.stringify(first.text)}`);
    assert.ok(Number.isFinite(first.loss), JSON.stringify(first));
    // Not every step: steps 2 to 5 leave the sample as it was.
    await singleSteps(page, 4);
    assert.equal((await sampleLines(page)).length, 1, 'the sample refreshes every few steps, not every step');
    // Meanwhile the panel says its newest line is older than the step training is at.
    assert.match(await page.getByTestId('sample-now').innerText(), /Training is at step 5; the newest line is from step 1/);
    // The clock samples again once 5 steps have passed and sampling is under a tenth of the
    // training time since the last sample: keep stepping until it has.
    let lines = await sampleLines(page);
    for (let i = 0; i < 30 && lines.length < 3; i++) {
      await singleSteps(page, 1);
      lines = await sampleLines(page);
    }
    assert.ok(lines.length >= 2, JSON.stringify(lines));
    const last = lines[0];
    assert.ok(last.step > first.step, JSON.stringify(lines));
    assert.ok(last.loss < first.loss, `the loss did not fall: ${JSON.stringify(lines)}`);
    assert.notEqual(last.text, first.text, `the sample did not change: ${JSON.stringify(lines)}`);
    // Its text is the bundled text's alphabet: lower case, spaces and . , ' ! ?
    for (const l of lines) assert.match(l.text, /^[a-z .,'!?]+$/, l.text);
    assert.equal(await sample.getAttribute('data-step'), String(last.step));
  } finally {
    await context.close();
  }
});

test('each task can be picked, trains a step without error and reopens from its link', { timeout: 600_000 }, async () => {
  const first = await openReady(hashOf());
  try {
    const { page } = first;
    for (const task of ['reverse', 'modadd', 'text', 'copy']) {
      await setControl(page, 'task', task);
      await page.waitForFunction((t) => window.shardlab.settings.task === t && window.shardlab.configured && !window.shardlab.driving, task, { timeout: 60_000 });
      assert.match(location(page), new RegExp(`task=${task}(&|$)`));
      assert.equal(await page.getByTestId('task-explain').getAttribute('data-task'), task);
      assert.match(await page.getByTestId('task-explain').innerText(), new RegExp(`The task: ${task}`));
      assert.match(await page.getByTestId('run-facts').innerText(), new RegExp(`AdamW \\(lr 0.003\\), ${task} task`));
      const example = await page.getByTestId('example').innerText();
      if (task === 'modadd') assert.match(example, /\d+ \+ \d+ = \d+/, example);
      if (task === 'text') assert.match(example, /reads\s+[a-z·.,'!?]{8}\s/, example);
      assert.equal(await singleSteps(page, 1), 1, task);
      await page.waitForFunction(() => document.querySelectorAll('[data-testid="sample-line"]').length === 1, null, { timeout: 10_000 });
      const sample = await page.getByTestId('sample').innerText();
      if (task === 'text') assert.match(sample, /What the model writes[\s\S]*step 1 · loss \d/, sample);
      else assert.match(sample, /What the model predicts[\s\S]*step 1 · loss \d[\s\S]*input[\s\S]*target[\s\S]*predicted/, sample);
      assert.match(await page.getByTestId('example-prediction').innerText(), /after step 1/);
      assert.equal(await page.getByTestId('error').isVisible(), false, task);

      await assertLinkReopens(page, async (second) => {
        assert.equal((await formValues(second)).task, task);
        assert.equal(await second.getByTestId('task-explain').getAttribute('data-task'), task);
      }, task);
    }
    // A vocab too small for the text is flagged at vocab, before Step.
    await setControl(page, 'task', 'text');
    await settled(page);
    await setControl(page, 'vocab', '16');
    const err = page.locator('[data-testid="field-error"][data-field="vocab"]');
    await err.waitFor({ timeout: 30_000 });
    assert.match(await err.innerText(), /too small for this text: it has 31 distinct characters.*use vocab 31/);
    assert.equal(await page.getByTestId('play').isDisabled(), true);
  } finally {
    await first.context.close();
  }
});

test('optimizer and lr round-trip through the hash, and a bad lr is refused at its control', { timeout: 300_000 }, async () => {
  const { context, page } = await openReady(hashOf({ optimizer: 'sgd', lr: '0.1' }));
  try {
    const shown = await formValues(page);
    assert.equal(shown.optimizer, 'sgd');
    assert.equal(shown.lr, '0.1');
    assert.match(await page.getByTestId('run-facts').innerText(), /SGD \(lr 0\.1\), copy task/);
    assert.equal(await singleSteps(page, 1), 1);

    // A typed exponent is read, and written back in its shortest decimal.
    await setControl(page, 'lr', '3e-4');
    await page.waitForFunction(() => window.shardlab.settings.lr === 0.0003 && window.shardlab.configured, null, { timeout: 60_000 });
    assert.match(location(page), /lr=0\.0003(&|$)/);
    await setControl(page, 'optimizer', 'adamw');
    await page.waitForFunction(() => window.shardlab.settings.optimizer === 'adamw', null, { timeout: 60_000 });
    const again = await openReady(new URL(page.url()).hash);
    try {
      assert.deepEqual(await formValues(again.page), await formValues(page));
      assert.equal(await again.page.getByTestId('hash-notice').isVisible(), false);
    } finally {
      await again.context.close();
    }

    for (const bad of ['0', '-0.1', '2', '1e-9', 'abc', 'NaN', 'Infinity', '0.1.2', '']) {
      await setControl(page, 'lr', bad);
      const err = page.locator('[data-testid="field-error"][data-field="lr"]');
      assert.equal(await err.count(), 1, `lr “${bad}” was accepted`);
      assert.match(await err.innerText(), /^lr “/);
      assert.equal(await page.getByTestId('play').isDisabled(), true, bad);
      assert.equal(await page.getByTestId('error').isVisible(), false, bad);
    }
    await setControl(page, 'lr', '0.01');
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
  } finally {
    await context.close();
  }
  // A link with a bad lr shows it at its control, and why.
  const hostile = await openReady(hashOf({ lr: '0' }));
  try {
    assert.match(await hostile.page.locator('[data-testid="field-error"][data-field="lr"]').innerText(), /lr “0” must be from/);
    assert.equal((await formValues(hostile.page)).lr, '0');
  } finally {
    await hostile.context.close();
  }
});

const JAX_CALLS = {
  PartitionSpec: 'jax.sharding.PartitionSpec',
  NamedSharding: 'jax.sharding.NamedSharding',
  'all-reduce': 'jax.lax.psum',
  'all-gather': 'jax.lax.all_gather',
  'reduce-scatter': 'jax.lax.psum_scatter',
  'all-to-all': 'jax.lax.all_to_all',
  'collective-permute': 'jax.lax.ppermute',
  'dynamic-slice': 'jax.lax.dynamic_slice',
  Threefry: 'threefry2x32',
  fold_in: 'jax.random.fold_in',
  dp: "P('dp')",
  fsdp: "P('fsdp', None)",
  zero1: 'on the optimizer state only',
  zero2: 'with_sharding_constraint(grad',
  microbatch: 'jax.value_and_grad',
  tp: "P(None, 'tp')",
  'mixture of experts': 'jax.lax.top_k',
  ep: "jax.lax.all_to_all(x, 'ep'",
  mesh: 'jax.make_mesh',
};

const popover = (page) => page.evaluate(() => {
  const p = document.querySelector('[data-testid="term-popover"]');
  return { visible: !p.hidden && p.offsetWidth > 0, term: p.dataset.term, text: p.innerText };
});

test('the glossary lists every term with its JAX call and opens by keyboard, click, hover and tap', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf({ preset: 'fsdp' }));
  try {
    const entries = await page.evaluate(() => Object.fromEntries([...document.querySelectorAll('[data-testid="glossary-entry"]')]
      .map((dt) => [dt.dataset.term, dt.nextElementSibling.querySelector('[data-testid="glossary-jax"]').innerText])));
    assert.deepEqual(Object.keys(entries).sort(), Object.keys(JAX_CALLS).sort());
    for (const [term, call] of Object.entries(JAX_CALLS)) assert.ok(entries[term].includes(call), `${term}: ${entries[term]}`);

    // Keyboard: Tab reaches a term and shows it; Escape closes it; Tab moves on.
    await page.locator('#glossary h2').click();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.dataset.term), 'PartitionSpec');
    let p = await popover(page);
    assert.equal(p.visible, true);
    assert.match(p.text, /PartitionSpec[\s\S]*In JAX: jax\.sharding\.PartitionSpec/);
    await page.keyboard.press('Escape');
    assert.equal((await popover(page)).visible, false);
    await page.keyboard.press('Tab');
    p = await popover(page);
    assert.equal(p.term, 'NamedSharding');
    assert.equal(p.visible, true);
    // Enter on a focused term keeps it open.
    await page.keyboard.press('Enter');
    assert.equal((await popover(page)).visible, true);
    await page.keyboard.press('Escape');

    // The page's own text marks its terms: fsdp's collectives in the table and the story.
    const inTable = page.locator('#program-auto [data-testid="collective-row"] .term[data-term="all-gather"]');
    assert.equal(await inTable.count(), 1);
    for (const term of ['all-gather', 'reduce-scatter', 'Threefry']) {
      assert.ok(await page.locator(`#story-steps .term[data-term="${term}"]`).count() >= 1, `the story does not mark ${term}`);
    }
    assert.ok(await page.locator('#run-facts .term[data-term="fsdp"]').count() === 1);
    // Not a native tooltip: no title on any term.
    assert.equal(await page.locator('.term[title]').count(), 0);

    // Click pins it (a second click closes it); hover shows it and leaving hides it.
    await inTable.click();
    p = await popover(page);
    assert.equal(p.visible, true);
    assert.match(p.text, /all-gather[\s\S]*jax\.lax\.all_gather/);
    await page.mouse.move(0, 0);
    assert.equal((await popover(page)).visible, true, 'a clicked term stays open');
    await inTable.click();
    assert.equal((await popover(page)).visible, false);
    await page.locator('#story-steps .term[data-term="Threefry"]').first().hover();
    assert.equal((await popover(page)).term, 'Threefry');
    assert.equal((await popover(page)).visible, true);
    await page.locator('#glossary h2').hover();
    assert.equal((await popover(page)).visible, false);
  } finally {
    await context.close();
  }

  // Tap, on a touch screen.
  const touch = await openPage({ hasTouch: true, isMobile: true, viewport: { width: 420, height: 900 } });
  try {
    await touch.page.goto(URL_ + hashOf({ preset: 'fsdp' }));
    await touch.page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 60_000 });
    const term = touch.page.locator('#story-steps .term[data-term="reduce-scatter"]').first();
    await term.scrollIntoViewIfNeeded();
    await term.tap();
    const p = await popover(touch.page);
    assert.equal(p.visible, true);
    assert.match(p.text, /reduce-scatter[\s\S]*jax\.lax\.psum_scatter/);
  } finally {
    await touch.context.close();
  }
});

test('Reset forgets the samples, and the new run samples from its first step', { timeout: STEP_TIMEOUT_MS * 2 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    await singleSteps(page, 1);
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="sample-line"]').length === 1, null, { timeout: 10_000 });
    await page.getByTestId('reset').click();
    await page.waitForFunction(() => window.shardlab.steps === 0 && !window.shardlab.driving, null, { timeout: 30_000 });
    assert.equal(await page.locator('[data-testid="sample-line"]').count(), 0);
    assert.match(await page.getByTestId('sample').innerText(), /not trained yet/);
    // The first step of the new run samples again.
    await singleSteps(page, 1);
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="sample-line"]').length === 1, null, { timeout: 10_000 });
  } finally {
    await context.close();
  }
});
